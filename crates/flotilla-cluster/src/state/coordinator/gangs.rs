//! Gangs: all members placed at once on reserved resources, restarted together.

use super::*;

impl Coordinator {
    /// Places the gangs of a class whose members are all `Ready`, oldest gang first; stops
    /// at the first gang that does not fit (later ones would not either).
    /// Whether it placed one. A gang that would take its tenant beyond `room` is not placed
    /// (the job's `quota_wait` says so) and stops the class.
    pub(super) fn schedule_gangs(
        &mut self,
        job: JobId,
        c: usize,
        mut room: Held,
        out: &mut Vec<Command>,
    ) -> bool {
        let mut leaders: Vec<TaskId> = Vec::new();
        {
            let j = &self.jobs[&job];
            for &t in &j.classes[c].ready {
                if let Some(g) = j.graph.task(TaskId::new(t)).gang {
                    if leaders.last() != Some(&g.first) {
                        leaders.push(g.first);
                    }
                }
            }
        }
        let mut placed = false;
        for leader in leaders {
            let j = &self.jobs[&job];
            let one = j.max_charge(leader);
            let size = self.gang_members(job, leader).len() as f64;
            let need = Held {
                cpus: one.cpus * size,
                gpus: one.gpus * size,
            };
            if need.cpus > room.cpus + 1e-9 || need.gpus > room.gpus + 1e-9 {
                self.jobs.get_mut(&job).expect("active").quota_wait = Some(format!(
                    "its next gang needs {} CPUs and {} GPUs, more than its tenant's quota \
                     leaves now",
                    need.cpus, need.gpus
                ));
                break;
            }
            match self.place_gang(job, leader, out) {
                Placed::Yes => {
                    placed = true;
                    room.add(need, -1.0);
                }
                Placed::Deferred => {}
                Placed::Blocked | Placed::NoRoom => break,
            }
        }
        placed
    }

    /// The members of the gang led by `leader`.
    pub(super) fn gang_members(&self, job: JobId, leader: TaskId) -> std::ops::Range<u32> {
        let size = self.jobs[&job]
            .graph
            .task(leader)
            .gang
            .map_or(1, |g| g.size);
        leader.0..leader.0 + size
    }

    /// All or nothing: every member of the gang gets a reserved slot (never a queued one, so
    /// all start at once) in the same call, or none is placed.
    pub(super) fn place_gang(
        &mut self,
        job: JobId,
        leader: TaskId,
        out: &mut Vec<Command>,
    ) -> Placed {
        let members = self.gang_members(job, leader);
        {
            let j = &self.jobs[&job];
            let mut done = Vec::new();
            for m in members.clone() {
                match j.tasks[m as usize].state {
                    TaskState::Ready => {}
                    TaskState::Done => done.push(TaskId::new(m)),
                    // Not all back yet (a member in backoff, or still reporting).
                    _ => return Placed::Deferred,
                }
            }
            if !done.is_empty() {
                // A member finished before the gang broke: the gang reruns as a whole.
                let j = self.job(job);
                j.undo_done(&done, "rerun with its gang", out);
                if done
                    .iter()
                    .any(|&m| j.tasks[m.index()].state != TaskState::Ready)
                {
                    return Placed::Deferred;
                }
            }
        }
        let mut staged = Vec::with_capacity(members.len());
        for m in members.clone() {
            match self.stage(job, TaskId::new(m), out) {
                Ok(x) => staged.push(x),
                Err(p) => return p,
            }
        }
        let decisions = {
            let j = &self.jobs[&job];
            let options: Vec<_> = members.clone().map(|m| j.options(TaskId::new(m))).collect();
            let classes: Vec<usize> = members
                .clone()
                .map(|m| j.class_of(TaskId::new(m)))
                .collect();
            let problems: Vec<Problem<'_>> = options
                .iter()
                .zip(&staged)
                .zip(&classes)
                .map(|((o, (local, _)), &c)| Problem {
                    options: o.clone(),
                    local_bytes: local,
                    queue_depth: 0,
                    explore: j.classes[c].explore,
                })
                .collect();
            let model = &self.model;
            let predict = |k: usize, v: Option<usize>, hw: &str| {
                Job::predict(model, &j.classes[classes[k]].codelet, &options[k], v, hw)
            };
            // Gangs run on the operator's own workers only (a gang's members cannot be
            // verified one by one).
            sched::place_gang(
                &problems,
                self.workers
                    .values()
                    .filter(|w| {
                        w.spec.provider.is_none()
                            && !w.unavailable
                            && members.clone().all(|m| self.in_time(j, TaskId::new(m), w))
                    })
                    .map(Worker::node),
                &predict,
            )
        };
        let Some(decisions) = decisions else {
            return Placed::Blocked;
        };
        let size = members.len() as u32;
        let attempt = self.jobs[&job].tasks[leader.index()].attempt + 1;
        let key = format!("{}-{}-{attempt}", job, leader);
        // A member's machine: its worker's host name and the IP of its data address (two
        // pods of one node share the node's name, not a network).
        let hosts: Vec<(&str, Option<std::net::IpAddr>)> = decisions
            .iter()
            .map(|d| {
                self.workers.get(&d.worker).map_or(("", None), |w| {
                    (w.spec.hostname.as_str(), reachable_ip(&w.spec.data_addr))
                })
            })
            .collect();
        let master_addr = self.master_addr(&decisions, &hosts);
        let master_port = super::super::gang_port(&key);
        let local: Vec<(u32, u32)> = hosts
            .iter()
            .enumerate()
            .map(|(r, h)| {
                let before = hosts[..r].iter().filter(|o| *o == h).count() as u32;
                let all = hosts.iter().filter(|o| *o == h).count() as u32;
                (before, all)
            })
            .collect();
        for (((m, d), (_, inputs)), (local_rank, local_size)) in
            members.zip(decisions).zip(staged).zip(local)
        {
            let gang = GangAssignment {
                rank: m - leader.0,
                size,
                key: key.clone(),
                local_rank,
                local_size,
                master_addr: master_addr.clone(),
                master_port,
            };
            self.assign_member(job, TaskId::new(m), d, inputs, Some(gang), None, out);
        }
        Placed::Yes
    }

    /// Where a gang's rank 0 is reached by the other members (`MASTER_ADDR`): the IP of
    /// its worker's data address when other machines reach it (`--data-listen`); else
    /// loopback when every member shares its machine; else its worker's host name.
    fn master_addr(
        &self,
        decisions: &[Decision],
        hosts: &[(&str, Option<std::net::IpAddr>)],
    ) -> String {
        if let Some((_, Some(ip))) = hosts.first() {
            return ip.to_string();
        }
        if hosts.iter().all(|h| *h == hosts[0]) {
            return "127.0.0.1".into();
        }
        decisions
            .first()
            .and_then(|d| self.workers.get(&d.worker))
            .map_or_else(String::new, |w| w.spec.hostname.clone())
    }

    /// A member of a gang failed, was cancelled or lost its worker (its own state is already
    /// dealt with): the other members' current attempts are cancelled and remembered as
    /// broken, so their reports (probably failures: their peer is gone) count nothing; members
    /// not on a live worker go back to `Ready`/`Waiting` at once. With `failures`, every
    /// member's failure count becomes that (the gang's retries are counted once per restart).
    pub(super) fn break_gang(
        &mut self,
        job: JobId,
        t: TaskId,
        failures: Option<u32>,
        message: &str,
        out: &mut Vec<Command>,
    ) {
        let Some(g) = self.jobs[&job].graph.task(t).gang else {
            return;
        };
        let active = self.jobs[&job].is_active();
        for m in self.gang_members(job, g.first) {
            let m = TaskId::new(m);
            if m == t {
                continue;
            }
            let (state, attempt, owner) = {
                let rt = &mut self.job(job).tasks[m.index()];
                if let Some(f) = failures {
                    rt.failures = rt.failures.max(f);
                }
                (rt.state, rt.attempt, rt.worker)
            };
            if !active || !matches!(state, TaskState::Assigned | TaskState::Running) {
                continue;
            }
            let why = format!("gang restarts: {message}");
            self.break_attempt(TaskRef { job, task: m }, attempt, owner, &why, out);
        }
    }

    /// Stops the current attempt of `task` (on `owner`) for a reason outside it: cancelled
    /// on a live worker and remembered as broken, so its report, whatever it says, counts
    /// nothing and puts the task back to `Ready`/`Waiting`; on a worker that is gone, back
    /// at once with `why`.
    pub(super) fn break_attempt(
        &mut self,
        task: TaskRef,
        attempt: u32,
        owner: Option<WorkerId>,
        why: &str,
        out: &mut Vec<Command>,
    ) {
        match owner.and_then(|w| self.workers.get_mut(&w)) {
            Some(w) => {
                if let Some(slot) = w.slots.get_mut(&(task, attempt)) {
                    slot.cancel_sent = true;
                }
                let wid = w.id;
                out.push(Command::Cancel {
                    worker: wid,
                    task,
                    attempt,
                });
                self.job(task.job).broken.insert((task.task, attempt));
            }
            None => {
                self.ghosts.remove(&task);
                let j = self.job(task.job);
                j.tasks[task.task.index()].worker = None;
                j.runnable(task.task, Some(why.to_string()), out);
            }
        }
    }
}

/// The IP of a data address (`IP:PORT`) when other machines may reach it: not loopback,
/// not unspecified.
fn reachable_ip(data_addr: &str) -> Option<std::net::IpAddr> {
    data_addr
        .parse::<std::net::SocketAddr>()
        .ok()
        .map(|a| a.ip())
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
}
