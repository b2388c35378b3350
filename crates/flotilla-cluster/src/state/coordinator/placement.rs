//! Placing ready tasks (the problem → solution in `flotilla_sched::cluster`), staging their
//! inputs, assigning them, and work stealing by idle workers.

use super::pool::Refusal;
use super::*;

/// One tenant's turns in a scheduling pass.
#[derive(Default)]
struct Turn {
    quota: Quota,
    /// What its tasks in flight are charged.
    used: Held,
    /// Its active jobs seen so far (for the running-jobs quota).
    active: usize,
    /// Its jobs that may place tasks, oldest first, and where it is in them.
    jobs: Vec<JobId>,
    next: usize,
    /// Position in the current job's class order.
    class: usize,
    /// Ready tasks of the current class passed over: a pool job's task that no worker may
    /// run (a replica whose other replicas' providers are the only ones in reach) does not
    /// hold back the tasks behind it, up to [`LOOKAHEAD`].
    skip: usize,
}

/// How many of a pool job's ready tasks of one class are tried past ones no worker may run,
/// per pass: the rules that refuse one task (its replicas' providers, its own deadline) may
/// accept the next, while budget and room refuse them all (so the look is bounded).
const LOOKAHEAD: usize = 16;

impl Turn {
    fn next_class(&mut self) {
        self.class += 1;
        self.skip = 0;
    }
}

/// The task shapes ([`Class::shape`](super::job::Class)) that fit on no worker in this
/// pass: placing only takes room, so a later task of the same shape would not fit either
/// and is not tried (with thousands of queued jobs, trying each one on every event made a
/// pass cost as many failed placements as jobs).
#[derive(Default)]
struct NoRoom(Vec<u64>);

/// A tenant's CPU and GPU quotas, as said in messages.
fn quota_text(quota: &Quota) -> String {
    let limit = |q: Option<f64>, what: &str| {
        q.map_or(format!("no limit on {what}"), |c| format!("{c} {what}"))
    };
    format!(
        "{}, {}",
        limit(quota.cpus, "CPUs"),
        limit(quota.gpus, "GPUs")
    )
}

/// What one turn did.
enum Step {
    /// Placed tasks charged this much.
    Placed(Held),
    /// Nothing more of this tenant fits now.
    Exhausted,
    /// Its next task would take it over its quota.
    OverQuota,
}

impl Coordinator {
    /// Places ready tasks: tenants take turns by Dominant Resource Fairness (the tenant whose
    /// largest share of the cluster's CPUs or GPUs is smallest places its next task), each
    /// within its quotas; within a tenant, oldest job first, then by class priority. With
    /// one tenant this is the plain oldest-job-first order.
    pub(super) fn schedule(&mut self, out: &mut Vec<Command>) {
        if self.workers.is_empty() || self.full() {
            return;
        }
        if self.quotas.is_empty() && self.ready_tenants.len() <= 1 {
            // One tenant placing, no quotas: its jobs with ready tasks, oldest first (what
            // the turns below come to), without a walk over every active job.
            let mut no_room = NoRoom::default();
            let mut from = 0;
            while let Some(&job) = self.ready_jobs.range(JobId::new(from)..).next() {
                from = job.0 + 1;
                let mut turn = Turn {
                    jobs: vec![job],
                    ..Turn::default()
                };
                let unlimited = Held {
                    cpus: f64::INFINITY,
                    gpus: f64::INFINITY,
                };
                while let Step::Placed(_) = self.step(&mut turn, unlimited, &mut no_room, out) {
                    if self.full() {
                        return;
                    }
                }
            }
            return;
        }
        let mut tenants: BTreeMap<String, Turn> = BTreeMap::new();
        let mut no_room = NoRoom::default();
        for &job in &self.active {
            let j = &self.jobs[&job];
            if !tenants.contains_key(&j.tenant) {
                let turn = Turn {
                    quota: self.quotas.get(&j.tenant).cloned().unwrap_or_default(),
                    ..Turn::default()
                };
                tenants.insert(j.tenant.clone(), turn);
            }
            let turn = tenants.get_mut(&j.tenant).expect("inserted above");
            turn.used.add(j.held, 1.0);
            turn.active += 1;
            let runs = turn
                .quota
                .running_jobs
                .is_none_or(|n| turn.active <= n as usize);
            let wait = (!runs).then(|| {
                format!(
                    "tenant {:?} runs {} of its jobs at once (its --running-jobs quota): this \
                     one waits for an earlier one to finish",
                    j.tenant,
                    turn.quota.running_jobs.unwrap_or_default()
                )
            });
            if runs && j.counts[TaskState::Ready.index()] > 0 {
                turn.jobs.push(job);
            }
            self.jobs.get_mut(&job).expect("active").quota_wait = wait;
        }
        let (cpus, gpus) = self.workers.total();
        let total = Held { cpus, gpus };
        let share = |u: &Held| {
            let c = if total.cpus > 0.0 {
                u.cpus / total.cpus
            } else {
                0.0
            };
            let g = if total.gpus > 0.0 {
                u.gpus / total.gpus
            } else {
                0.0
            };
            c.max(g)
        };
        // The tenant with the smallest dominant share (then the oldest waiting job) goes next.
        while let Some(name) = tenants
            .iter()
            .filter(|(_, t)| t.next < t.jobs.len())
            .min_by(|a, b| {
                share(&a.1.used)
                    .total_cmp(&share(&b.1.used))
                    .then(a.1.jobs[a.1.next].cmp(&b.1.jobs[b.1.next]))
            })
            .map(|(n, _)| n.clone())
        {
            let turn = tenants.get_mut(&name).expect("picked above");
            let room = Held {
                cpus: turn
                    .quota
                    .cpus
                    .map_or(f64::INFINITY, |q| q - turn.used.cpus),
                gpus: turn
                    .quota
                    .gpus
                    .map_or(f64::INFINITY, |q| q - turn.used.gpus),
            };
            match self.step(turn, room, &mut no_room, out) {
                Step::Placed(d) => {
                    turn.used.add(d, 1.0);
                    if self.full() {
                        break;
                    }
                }
                Step::Exhausted => turn.next = turn.jobs.len(),
                Step::OverQuota => {
                    let quota = quota_text(&turn.quota);
                    let why = if turn.used.cpus == 0.0 && turn.used.gpus == 0.0 {
                        // Nothing of it runs: waiting would be for ever.
                        format!(
                            "tenant {name:?}'s next ready task needs more than its whole quota \
                             ({quota}): it cannot run until an admin raises it (`flotilla admin \
                             tenant set {name} --cpus N`)"
                        )
                    } else {
                        format!(
                            "tenant {name:?} holds {} CPUs and {} GPUs of its quota ({quota}): \
                             its ready tasks wait for its running ones",
                            turn.used.cpus, turn.used.gpus,
                        )
                    };
                    for job in &turn.jobs[turn.next..] {
                        if let Some(j) = self.jobs.get_mut(job) {
                            j.quota_wait = Some(why.clone());
                        }
                    }
                    turn.next = turn.jobs.len();
                }
            }
        }
    }

    /// Whether nothing more can be placed now: every available worker's CPUs are taken and its
    /// queue is full, and no active job has tasks that ask for no CPU. A pass then stops (or
    /// is not made): with thousands of queued jobs, walking them on every event made each
    /// event cost as much as the queue is long.
    fn full(&mut self) -> bool {
        const SLACK: f64 = 1e-9;
        self.workers.refresh();
        self.cpuless.is_empty() && self.workers.all_full(self.config.queue_depth, SLACK)
    }

    /// Places the next task (or gangs) of a tenant's turn within `room`.
    fn step(
        &mut self,
        turn: &mut Turn,
        room: Held,
        no_room: &mut NoRoom,
        out: &mut Vec<Command>,
    ) -> Step {
        const SLACK: f64 = 1e-9;
        loop {
            let Some(&job) = turn.jobs.get(turn.next) else {
                return Step::Exhausted;
            };
            let j = &self.jobs[&job];
            let Some(&c) = j.class_order.get(turn.class) else {
                turn.next += 1;
                turn.class = 0;
                turn.skip = 0;
                continue;
            };
            let before = j.held;
            let first = TaskId::new(j.classes[c].first);
            if j.graph.task(first).gang.is_some() {
                let placed = self.schedule_gangs(job, c, room, out);
                turn.next_class();
                let j = &self.jobs[&job];
                if placed {
                    let mut d = j.held;
                    d.add(before, -1.0);
                    return Step::Placed(d);
                }
                if j.quota_wait.is_some() {
                    return Step::OverQuota;
                }
                continue;
            }
            let Some(&t) = j.classes[c].ready.iter().nth(turn.skip) else {
                turn.next_class();
                continue;
            };
            let shape = j.classes[c].shape;
            if no_room.0.contains(&shape) {
                turn.next_class();
                continue;
            }
            let need = j.max_charge(TaskId::new(t));
            let whole = |q: Option<f64>| q.map_or(f64::INFINITY, |q| q);
            if need.cpus > whole(turn.quota.cpus) + SLACK
                || need.gpus > whole(turn.quota.gpus) + SLACK
            {
                // It can never run within the quota: its class waits, saying so, and the
                // tenant's other tasks and jobs go on (it held them all back).
                let why = format!(
                    "tenant {:?}'s task {} needs more than the tenant's whole quota ({}): it \
                     cannot run until an admin raises it (`flotilla admin tenant set {} --cpus \
                     N`)",
                    j.tenant,
                    j.graph.task(TaskId::new(t)).name,
                    quota_text(&turn.quota),
                    j.tenant
                );
                self.jobs.get_mut(&job).expect("active").quota_wait = Some(why);
                turn.next_class();
                continue;
            }
            if need.cpus > room.cpus + SLACK || need.gpus > room.gpus + SLACK {
                return Step::OverQuota;
            }
            match self.place_one(job, TaskId::new(t), out) {
                Placed::Yes => {
                    let mut d = self.jobs[&job].held;
                    d.add(before, -1.0);
                    return Step::Placed(d);
                }
                Placed::Deferred => {}
                Placed::Blocked => {
                    // A job paused for budget or credits refuses its class's next tasks alike
                    // (same shape, same hold): no look past it, so a paused job costs a pass
                    // one try, not sixteen.
                    let per_task = self.jobs[&job]
                        .pool
                        .as_deref()
                        .is_some_and(|p| p.paused.is_none());
                    if per_task && turn.skip + 1 < LOOKAHEAD {
                        turn.skip += 1;
                    } else {
                        turn.next_class();
                    }
                }
                Placed::NoRoom => {
                    no_room.0.push(shape);
                    turn.next_class();
                }
            }
        }
    }

    /// Transfer staging: where a task's inputs are (bytes per worker) and what to fetch from
    /// whom. `Err` when it cannot be placed now: holders are ghosts still in their grace
    /// (`Blocked`), or lost (their producers are rerun, `Deferred`).
    #[allow(clippy::type_complexity)]
    pub(super) fn stage(
        &mut self,
        job: JobId,
        t: TaskId,
        out: &mut Vec<Command>,
    ) -> std::result::Result<(HashMap<WorkerId, u64>, Vec<(ObjectRef, String)>), Placed> {
        let staging = self.jobs[&job].staging;
        let mut local_bytes: HashMap<WorkerId, u64> = HashMap::new();
        let mut inputs: Vec<(ObjectRef, String)> = Vec::new();
        if staging == Staging::Transfer {
            let j = &self.jobs[&job];
            let mut lost = Vec::new();
            let mut waiting_for_ghosts = false;
            // Every output of each direct predecessor, and the declared inputs made by other
            // ancestors (each file alone).
            let preds = j.graph.preds(t);
            let mut sources: Vec<(TaskId, Option<&str>)> =
                preds.iter().map(|&p| (p, None)).collect();
            for input in &j.graph.task(t).inputs {
                if let Some(&p) = j.producers.get(input) {
                    if p != t && !preds.contains(&p) {
                        sources.push((p, Some(input.as_str())));
                    }
                }
            }
            for (p, only) in sources {
                let Some(all) = j.outputs.get(&p).filter(|o| !o.is_empty()) else {
                    continue;
                };
                let objs: Vec<&ObjectRef> = all
                    .iter()
                    .filter(|o| only.is_none_or(|path| o.path == path))
                    .collect();
                if objs.is_empty() {
                    continue;
                }
                let live: Vec<WorkerId> = j
                    .holders
                    .get(&p)
                    .map(|hs| {
                        hs.iter()
                            .copied()
                            .filter(|h| self.workers.contains_key(h))
                            .collect()
                    })
                    .unwrap_or_default();
                match live.first() {
                    Some(first) => {
                        let addr = self.workers[first].spec.data_addr.clone();
                        let bytes: u64 = objs.iter().map(|o| o.size).sum();
                        for o in objs {
                            inputs.push((o.clone(), addr.clone()));
                        }
                        for h in live {
                            *local_bytes.entry(h).or_default() += bytes;
                        }
                    }
                    None if self.in_grace() && self.has_ghost_holder(job, p) => {
                        waiting_for_ghosts = true;
                    }
                    None => lost.push(p),
                }
            }
            if waiting_for_ghosts {
                return Err(Placed::Blocked);
            }
            if !lost.is_empty() {
                for p in lost {
                    self.rerun(job, p, "its outputs are held by no live worker", out);
                }
                return Err(Placed::Deferred);
            }
        }
        Ok((local_bytes, inputs))
    }

    pub(super) fn place_one(&mut self, job: JobId, t: TaskId, out: &mut Vec<Command>) -> Placed {
        let (local_bytes, inputs) = match self.stage(job, t, out) {
            Ok(x) => x,
            Err(p) => return p,
        };
        self.workers.refresh();
        let pooled = self.jobs[&job].pool.is_some() || self.provider_workers > 0;
        if pooled {
            self.refresh_ratios();
            self.refresh_plan(job);
        }
        let j = &self.jobs[&job];
        let c = j.class_of(t);
        let options = j.options(t);
        let codelet = &j.classes[c].codelet;
        let model = &self.model;
        let predict = |v: Option<usize>, hw: &str| Job::predict(model, codelet, &options, v, hw);
        let problem = Problem {
            options: options.clone(),
            local_bytes: &local_bytes,
            queue_depth: self.config.queue_depth,
            explore: j.classes[c].explore,
        };
        let plain = match problem.options.as_slice() {
            [(None, need)] => Some(*need),
            _ => None,
        };
        // Whether a worker was passed over for leaving before the task would end.
        let excluded = std::cell::Cell::new(false);
        let decision = if pooled {
            self.pooled_decision(j, t, &problem, &predict)
        } else if let Some(need) = plain {
            // The workers in order of preference: the first that fits is the one a walk
            // over all of them would choose (O(log workers), not O(workers)).
            let workers = &self.workers;
            let in_time = |w: &&Worker| {
                let ok = self.in_time(j, t, w);
                excluded.set(excluded.get() || !ok);
                ok
            };
            let holders = local_bytes
                .keys()
                .filter_map(|id| workers.get(id))
                .filter(|w| !w.unavailable)
                .filter(in_time)
                .map(Worker::node);
            let ranked = sched::Ranked {
                holders,
                by_free: workers
                    .by_free(need.gpus > 0.0 || need.gpu_mem > 0)
                    .filter(in_time)
                    .map(Worker::node),
                by_queue: workers.by_queue().filter(in_time).map(Worker::node),
            };
            sched::place_plain_ranked(&problem, need, ranked, &predict).ok_or(Refusal::Other)
        } else {
            let live = self.workers.values().filter(|w| {
                let ok = self.in_time(j, t, w);
                excluded.set(excluded.get() || !ok);
                !w.unavailable && ok
            });
            sched::place(&problem, live.map(Worker::node), &predict).ok_or(Refusal::Other)
        };
        if pooled {
            self.pause_for(
                job,
                decision.as_ref().err().copied().unwrap_or(Refusal::None),
            );
        }
        let Ok(d) = decision else {
            // A pooled job's refusal depends on its own deadline and budget, not only on room.
            // Nor does a worker that leaves refuse by its shape alone (its time there).
            return if pooled || excluded.get() {
                Placed::Blocked
            } else {
                Placed::NoRoom
            };
        };
        self.assign(job, t, d, inputs, out);
        Placed::Yes
    }

    pub(super) fn assign(
        &mut self,
        job: JobId,
        t: TaskId,
        d: Decision,
        inputs: Vec<(ObjectRef, String)>,
        out: &mut Vec<Command>,
    ) {
        let worker = d.worker;
        let chain = d.variant.is_none() && self.jobs[&job].graph.task(t).gang.is_none();
        self.assign_member(job, t, d, inputs, None, None, out);
        if chain {
            let attempt = self.jobs[&job].tasks[t.index()].attempt;
            self.chain_successors(job, t, attempt, worker, out);
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn assign_member(
        &mut self,
        job: JobId,
        t: TaskId,
        d: Decision,
        inputs: Vec<(ObjectRef, String)>,
        gang: Option<GangAssignment>,
        after: Option<(TaskRef, u32)>,
        out: &mut Vec<Command>,
    ) {
        let j = self
            .jobs
            .get_mut(&job)
            .expect("placing a task of a known job");
        let w = self
            .workers
            .get_mut(&d.worker)
            .expect("placed on a live worker");
        let c = j.class_of(t);
        if d.explored {
            j.classes[c].explore = j.classes[c].explore.wrapping_add(1);
        }
        let variant = d.variant.map(|v| v as u16);
        let need = resources_of(j, t, variant).clone();
        let tref = j.tref(t);
        let rt = &mut j.tasks[t.index()];
        rt.attempt += 1;
        rt.worker = Some(w.id);
        rt.variant = variant;
        let rt_resume = rt
            .ext
            .as_ref()
            .map(|e| e.resume.clone())
            .unwrap_or_default();
        let attempt = rt.attempt;
        if d.reason.policy != "eager" {
            let e = rt.ext();
            e.reason = Some(d.reason.clone());
            e.reason_worker = Some(w.id);
        } else if let Some(e) = rt.ext.as_mut() {
            e.reason = None;
        }
        let gpu_indices = w.gpu_indices(&d.gpus);
        match after {
            Some(pred) => w.add_chained((tref, attempt), &need, pred),
            None => w.add((tref, attempt), &need, d.gpus, d.reserved),
        }
        let mut resources = Worker::charge(&need);
        if need.gpus >= 1.0 {
            resources.gpu_mem = need.gpu_mem;
        }
        let inst = j.graph.task(t);
        let env = |e: &std::collections::BTreeMap<String, String>| -> Vec<(String, String)> {
            e.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        let kind = match (&inst.kind, d.variant) {
            (TaskKind::Command { cmd, env: e, cwd }, _) => AssignedKind::Command {
                cmd: cmd.clone(),
                env: env(e),
                cwd: cwd.clone(),
            },
            (TaskKind::Variants(vs), Some(v)) => AssignedKind::Command {
                cmd: vs[v].cmd.clone(),
                env: env(&vs[v].env),
                cwd: vs[v].cwd.clone(),
            },
            (TaskKind::Variants(vs), None) => AssignedKind::Command {
                cmd: vs[0].cmd.clone(),
                env: env(&vs[0].env),
                cwd: vs[0].cwd.clone(),
            },
            (TaskKind::Wasm(m), _) => AssignedKind::Wasm {
                module: m.module.clone(),
                entry: m.entry.clone(),
                args: m.args.clone(),
                env: env(&m.env),
                fuel: m.fuel,
                memory: m.memory,
            },
        };
        let variant_name = j.variant_name(t, variant);
        let a = Assignment {
            task: tref,
            attempt,
            name: inst.name.clone(),
            job_name: j.name.clone(),
            job_dir: j.dir.clone(),
            staging: j.staging,
            kind,
            variant: variant_name.clone(),
            resources,
            gpu_indices: gpu_indices.clone(),
            timeout_ms: inst
                .timeout
                .map(|d| d.as_millis().min(u128::from(u64::MAX)) as u64),
            index: inst.index,
            inputs,
            outputs: inst.outputs.clone(),
            reason: d.reason,
            gang,
            after,
            checkpoint: inst.checkpoint.clone(),
            resume: rt_resume,
        };
        self.journal.push(JournalRecord::TaskAssigned {
            worker: w.id,
            task: tref,
            attempt,
            variant: variant_name,
            gpu_indices,
            hw_class: w.spec.hw_class.clone(),
        });
        let wid = w.id;
        self.pending.entry(wid).or_default().push(a);
        j.set_state(t, TaskState::Assigned, None, out);
        self.hold_for(job, t, attempt, wid);
    }

    /// Attempts queued on a worker that leaves, not started, that would no longer end
    /// before it does (their runtime learned since they were queued, or its time run down)
    /// are taken back (`Retract`, as for stealing) and placed again elsewhere, rather than
    /// cut when it leaves.
    pub(super) fn retract_late(&mut self, out: &mut Vec<Command>) {
        if self.leaves_at.is_empty() {
            return;
        }
        let mut late = Vec::new();
        for &wid in self.leaves_at.keys() {
            let Some(w) = self.workers.get(&wid) else {
                continue;
            };
            for key in w.queue.values() {
                let Some(s) = w.slots.get(key) else {
                    continue;
                };
                if s.started || s.late || s.thief.is_some() || s.cancel_sent || s.after.is_some() {
                    continue;
                }
                if self
                    .jobs
                    .get(&key.0.job)
                    .is_some_and(|j| !self.in_time(j, key.0.task, w))
                {
                    late.push((wid, *key));
                }
            }
        }
        for (worker, key) in late {
            if let Some(s) = self
                .workers
                .get_mut(&worker)
                .and_then(|w| w.slots.get_mut(&key))
            {
                s.late = true;
            }
            out.push(Command::Retract {
                worker,
                task: key.0,
                attempt: key.1,
            });
        }
    }

    /// An idle worker (nothing assigned or running, no retraction pending for it) takes
    /// half (rounded up) of the stealable queued tasks of the worker with the longest queue:
    /// `Retract` is sent; the tasks come back `Ready` on `TaskReturned` and are placed again,
    /// on the idle worker if it fits there first. Then the workers with room take what fits
    /// it ([`Coordinator::steal_into_room`]).
    pub(super) fn steal(&mut self, out: &mut Vec<Command>) {
        if self.config.queue_depth == 0 || self.workers.len() < 2 {
            return;
        }
        self.workers.refresh();
        if self.workers.most_stealable().1 == 0 {
            return; // nothing to steal anywhere, however many are idle
        }
        let idle = self.workers.idle();
        for thief in idle {
            self.workers.refresh();
            let (victims, left) = self.workers.most_stealable();
            if left == 0 {
                break;
            }
            let thief_worker = &self.workers[&thief];
            // Victim: the most queued tasks that fit the thief (then the lowest id), looked
            // for among the most stealable queues first: one with fewer stealable tasks than
            // the best found so far cannot hold more that fit.
            let mut best: Option<(WorkerId, Vec<(TaskRef, u32)>)> = None;
            for (n, v) in victims {
                if best.as_ref().is_some_and(|b| n < b.1.len()) {
                    break;
                }
                if v.id == thief || v.queue.is_empty() {
                    continue;
                }
                let stealable: Vec<(TaskRef, u32)> = v
                    .queue
                    .values()
                    .filter(|k| {
                        v.slots.get(k).is_some_and(|s| {
                            s.thief.is_none()
                                && !s.late
                                && !s.cancel_sent
                                && !s.started
                                && thief_worker.fits_total(&s.res)
                        })
                    })
                    .filter(|k| {
                        // A worker that leaves takes only what ends before it does.
                        !self.leaves_at.contains_key(&thief)
                            || self
                                .jobs
                                .get(&k.0.job)
                                .is_some_and(|j| self.in_time(j, k.0.task, thief_worker))
                    })
                    .copied()
                    .collect();
                if !stealable.is_empty()
                    && best.as_ref().is_none_or(|b| {
                        stealable.len() > b.1.len() || (stealable.len() == b.1.len() && v.id < b.0)
                    })
                {
                    best = Some((v.id, stealable));
                }
            }
            let Some((victim, stealable)) = best else {
                continue;
            };
            let take = stealable.len().div_ceil(2);
            // Newest first: the worker reaches them last.
            let chosen: Vec<(TaskRef, u32)> = stealable.iter().rev().take(take).copied().collect();
            self.retract_for(thief, victim, &chosen, out);
        }
        self.steal_into_room(out);
    }

    /// A worker busy in part, with CPUs free and nothing queued (a task of its own ended
    /// and nothing new was ready), takes queued plain attempts of the workers with the most
    /// stealable ones that fit its free resources now (at most half of a victim's, rounded
    /// up, newest first): they start at once instead of waiting behind the victim's running
    /// tasks. Only plain tasks of jobs outside the pool: placed again, they go where they
    /// fit free (here), not back to the victim's queue by a prediction.
    /// Thieves come most free CPUs first; each looks in the [`ROOM_VICTIMS`] most stealable
    /// queues holding a task it may take, and once that many thieves found nothing the pass
    /// stops (a pass stays bounded when nothing fits anywhere).
    fn steal_into_room(&mut self, out: &mut Vec<Command>) {
        if self.provider_workers > 0 {
            return;
        }
        self.workers.refresh();
        let stealable = self.workers.most_stealable().1;
        if stealable == 0 {
            return;
        }
        let mut failed = 0;
        // Each thief takes a stealable task or counts as failed: no more are looked at.
        for thief in self.workers.with_room(stealable + ROOM_VICTIMS) {
            self.workers.refresh();
            let (victims, left) = self.workers.most_stealable();
            if left == 0 || failed >= ROOM_VICTIMS {
                break;
            }
            let tw = &self.workers[&thief];
            let leaving = self.leaves_at.contains_key(&thief);
            let mut found: Option<(WorkerId, Vec<(TaskRef, u32)>)> = None;
            // Victims with a task it may take (plain, outside the pool) count against the
            // bound; those holding only others are passed over, up to a wider bound.
            let mut looked = 0;
            for (n, v) in victims.take(4 * ROOM_VICTIMS) {
                if v.id == thief {
                    continue;
                }
                let mut room = tw.ledger.clone();
                let mut chosen = Vec::new();
                let mut eligible = false;
                // Newest first: the victim reaches them last.
                for key in v.queue.values().rev() {
                    if chosen.len() >= n.div_ceil(2) {
                        break;
                    }
                    let Some(s) = v.slots.get(key) else {
                        continue;
                    };
                    if s.thief.is_some() || s.late || s.cancel_sent || s.started {
                        continue;
                    }
                    let Some(j) = self.jobs.get(&key.0.job) else {
                        continue;
                    };
                    // (Queued tasks are never gang members: a variant task is the one left.)
                    let plain = !matches!(j.graph.task(key.0.task).kind, TaskKind::Variants(_));
                    if !plain || j.pool.is_some() {
                        continue;
                    }
                    eligible = true;
                    if leaving && !self.in_time(j, key.0.task, tw) {
                        continue;
                    }
                    if let Some(gpus) = room.fit_free(&s.res) {
                        room.reserve(&s.res, &gpus);
                        chosen.push(*key);
                    }
                }
                if !chosen.is_empty() {
                    found = Some((v.id, chosen));
                    break;
                }
                looked += usize::from(eligible);
                if looked >= ROOM_VICTIMS {
                    break;
                }
            }
            // Nothing fits it: another thief may fit what this one does not (less CPU but
            // more memory, no leaving time), up to a bound of such thieves per pass.
            let Some((victim, chosen)) = found else {
                failed += 1;
                continue;
            };
            self.retract_for(thief, victim, &chosen, out);
        }
    }

    /// Takes `chosen` back from `victim` on behalf of `thief`: `Retract` for each, marked
    /// with the thief, counted as incoming there.
    fn retract_for(
        &mut self,
        thief: WorkerId,
        victim: WorkerId,
        chosen: &[(TaskRef, u32)],
        out: &mut Vec<Command>,
    ) {
        if let Some(v) = self.workers.get_mut(&victim) {
            for key in chosen {
                if let Some(s) = v.slots.get_mut(key) {
                    s.thief = Some(thief);
                }
                out.push(Command::Retract {
                    worker: victim,
                    task: key.0,
                    attempt: key.1,
                });
            }
        }
        if let Some(t) = self.workers.get_mut(&thief) {
            t.incoming += chosen.len() as u32;
        }
    }
}

/// How many of the most stealable queues (holding a task it may take) a worker with room
/// looks in, and how many such workers may find nothing in one pass.
const ROOM_VICTIMS: usize = 16;
