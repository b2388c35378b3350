//! Dependency inference: any submission sequence gives exactly the results of running the
//! same submissions one after another, under every policy.

#![allow(clippy::unwrap_used, clippy::type_complexity)]

use std::sync::Arc;

use flotilla_runtime::{Access, Codelet, PolicyKind, Runtime, RuntimeError};
use proptest::prelude::*;

/// One submission: the data it accesses (distinct indices) and how.
#[derive(Clone, Debug)]
struct Sub {
    accesses: Vec<(usize, Access)>,
    salt: u64,
}

fn mix(h: u64, v: u64) -> u64 {
    (h ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17)
}

/// What a task computes: every written value becomes a hash of everything it reads (in
/// access order), its own previous value (for RW) and the task's salt.
fn apply(sub: &Sub, read: &dyn Fn(usize) -> u64) -> Vec<(usize, u64)> {
    let mut h = sub.salt;
    for (d, m) in &sub.accesses {
        if m.reads() {
            h = mix(h, read(*d));
        }
    }
    sub.accesses
        .iter()
        .filter(|(_, m)| m.writes())
        .map(|(d, _)| (*d, mix(h, *d as u64)))
        .collect()
}

fn sequential(n_data: usize, subs: &[Sub]) -> Vec<u64> {
    let mut v: Vec<u64> = (0..n_data as u64).collect();
    for s in subs {
        let w = apply(s, &|d| v[d]);
        for (d, x) in w {
            v[d] = x;
        }
    }
    v
}

fn parallel(n_data: usize, subs: &[Sub], policy: PolicyKind) -> Vec<u64> {
    let rt = Runtime::builder()
        .cpus(3)
        .policy(policy)
        .model_path(None)
        .build()
        .unwrap();
    let data: Vec<_> = (0..n_data as u64).map(|i| rt.register(vec![i])).collect();
    for s in subs {
        let sub = s.clone();
        let c = Arc::new(Codelet::new("mix").cpu(move |ctx| {
            // Borrow each datum once (the context refuses a second mutable borrow), read
            // everything first, then write: reads see the previous version.
            let mut slots: Vec<(usize, Access, Option<&[u64]>, Option<&mut [u64]>)> = sub
                .accesses
                .iter()
                .enumerate()
                .map(|(i, (d, m))| match m {
                    Access::R => (*d, *m, Some(ctx.data::<u64>(i)), None),
                    _ => (*d, *m, None, Some(ctx.data_mut::<u64>(i))),
                })
                .collect();
            let reads: Vec<(usize, u64)> = slots
                .iter()
                .filter(|(_, m, _, _)| m.reads())
                .map(|(d, _, r, w)| (*d, r.map(|r| r[0]).or(w.as_ref().map(|w| w[0])).unwrap()))
                .collect();
            let lookup = |d: usize| {
                reads
                    .iter()
                    .find(|(x, _)| *x == d)
                    .map(|(_, v)| *v)
                    .unwrap_or(0)
            };
            for (d, x) in apply(&sub, &lookup) {
                let slot = slots.iter_mut().find(|s| s.0 == d).unwrap();
                slot.3.as_mut().unwrap()[0] = x;
            }
            Ok(())
        }));
        let mut t = rt.task(&c);
        for (d, m) in &s.accesses {
            t = t.access(&data[*d], *m);
        }
        t.submit().unwrap();
    }
    rt.wait_all().unwrap();
    data.into_iter()
        .map(|d| rt.unregister(d).unwrap()[0])
        .collect()
}

fn subs_strategy(n_data: usize) -> impl Strategy<Value = Vec<Sub>> {
    let access = prop_oneof![Just(Access::R), Just(Access::W), Just(Access::RW)];
    let sub = (
        proptest::sample::subsequence((0..n_data).collect::<Vec<_>>(), 1..4),
        proptest::collection::vec(access, 4),
        any::<u64>(),
    )
        .prop_map(|(ds, ms, salt)| Sub {
            accesses: ds.into_iter().zip(ms).collect(),
            salt,
        });
    proptest::collection::vec(sub, 1..120)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn random_submissions_match_sequential_execution(subs in subs_strategy(6)) {
        let want = sequential(6, &subs);
        for p in [PolicyKind::Ws, PolicyKind::Eager, PolicyKind::Dmda, PolicyKind::Random] {
            prop_assert_eq!(&parallel(6, &subs, p), &want, "policy {}", p);
        }
    }
}

#[test]
fn long_chain_runs_in_order() {
    let rt = Runtime::builder().cpus(2).model_path(None).build().unwrap();
    let x = rt.register(vec![0u64]);
    let inc = Arc::new(Codelet::new("inc").cpu(|ctx| {
        let v = ctx.data_mut::<u64>(0);
        v[0] = v[0].wrapping_mul(3).wrapping_add(1);
        Ok(())
    }));
    let mut want = 0u64;
    for _ in 0..5000 {
        rt.task(&inc).rw(&x).submit().unwrap();
        want = want.wrapping_mul(3).wrapping_add(1);
    }
    assert_eq!(rt.unregister(x).unwrap(), vec![want]);
}

#[test]
fn failed_task_stops_its_dependents_only() {
    let rt = Runtime::builder().cpus(2).model_path(None).build().unwrap();
    let a = rt.register(vec![1u32]);
    let b = rt.register(vec![1u32]);
    let boom = Arc::new(Codelet::new("boom").cpu(|_| Err("disk on fire".into())));
    let double = Arc::new(Codelet::new("double").cpu(|ctx| {
        ctx.data_mut::<u32>(0)[0] *= 2;
        Ok(())
    }));
    let h_fail = rt.task(&boom).rw(&a).submit().unwrap();
    let h_dep = rt.task(&double).rw(&a).submit().unwrap();
    let h_ok = rt.task(&double).rw(&b).submit().unwrap();
    let err = rt.wait_all().unwrap_err().to_string();
    assert!(err.contains("disk on fire"), "{err}");
    assert!(!h_fail.wait());
    assert!(!h_dep.wait());
    assert!(h_ok.wait());
    assert_eq!(rt.unregister(b).unwrap(), vec![2]);
    // A later reader of the poisoned data fails too, without running.
    let h_late = rt.task(&double).rw(&a).submit().unwrap();
    assert!(!h_late.wait());
    assert!(rt.wait_all().is_err());
}

/// Failure follows the data: reading back a datum whose last writer failed is an error
/// (it returned the old contents as Ok), a task that only waited for a failed task (it
/// writes what the failed one read) runs, and a task that writes the datum whole runs and
/// makes it valid again (it failed, as every task after a failure did).
#[test]
fn stale_data_is_refused_until_written_whole() {
    let rt = Runtime::builder().cpus(2).model_path(None).build().unwrap();
    let a = rt.register(vec![5u32; 4]);
    let src = rt.register(vec![7u32; 4]);
    let boom = Arc::new(Codelet::new("boom").cpu(|_| Err("disk on fire".into())));
    let fill = Arc::new(Codelet::new("fill").cpu(|ctx| {
        ctx.data_mut::<u32>(0).fill(9);
        Ok(())
    }));
    let double = Arc::new(Codelet::new("double").cpu(|ctx| {
        ctx.data_mut::<u32>(0).iter_mut().for_each(|x| *x *= 2);
        Ok(())
    }));
    // `boom` reads `src` and fails writing `a`.
    rt.task(&boom).read(&src).write(&a).submit().unwrap();
    let err = rt.read(&a).unwrap_err();
    assert!(matches!(err, RuntimeError::Poisoned { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("the last task that wrote it failed"),
        "{err}"
    );
    assert!(rt
        .wait_all()
        .unwrap_err()
        .to_string()
        .contains("disk on fire"));
    // `src` was only read by the failed task: overwriting it waits for it, then runs.
    assert!(rt.task(&fill).write(&src).submit().unwrap().wait());
    assert_eq!(rt.read(&src).unwrap(), vec![9; 4]);
    // Updating `a` in place reads the stale contents: not run, and `a` stays stale.
    assert!(!rt.task(&double).rw(&a).submit().unwrap().wait());
    assert!(rt.read(&a).is_err());
    rt.wait_all().unwrap_err();
    // Written whole, it is valid again, and what follows runs.
    assert!(rt.task(&fill).write(&a).submit().unwrap().wait());
    assert!(rt.task(&double).rw(&a).submit().unwrap().wait());
    rt.wait_all().unwrap();
    assert_eq!(rt.unregister(a).unwrap(), vec![18; 4]);
    // unregister refuses a stale datum too.
    let b = rt.register(vec![1u32]);
    rt.task(&boom).rw(&b).submit().unwrap();
    let err = rt.unregister(b).unwrap_err();
    assert!(matches!(err, RuntimeError::Poisoned { .. }), "{err}");
    rt.wait_all().unwrap_err();
}

#[test]
fn a_runtime_with_nothing_to_run_tasks_is_refused() {
    let Err(err) = Runtime::builder()
        .cpus(0)
        .devices(flotilla_runtime::DeviceSelection::None)
        .model_path(None)
        .build()
    else {
        panic!("a runtime with no CPU workers and no devices was built");
    };
    assert!(err.to_string().contains("cpus(0) and no devices"), "{err}");
}

#[test]
fn panicking_task_is_reported_and_workers_survive() {
    let rt = Runtime::builder().cpus(2).model_path(None).build().unwrap();
    let a = rt.register(vec![0u8]);
    let p = Arc::new(Codelet::new("panics").cpu(|_| panic!("kaboom")));
    rt.task(&p).rw(&a).submit().unwrap();
    let err = rt.wait_all().unwrap_err().to_string();
    assert!(err.contains("kaboom"), "{err}");
    let ok = Arc::new(Codelet::new("ok").cpu(|ctx| {
        ctx.data_mut::<u8>(0)[0] = 7;
        Ok(())
    }));
    let b = rt.register(vec![0u8]);
    rt.task(&ok).write(&b).submit().unwrap();
    assert_eq!(rt.unregister(b).unwrap(), vec![7]);
}

#[test]
fn bad_submissions_are_refused() {
    let rt = Runtime::builder().cpus(1).model_path(None).build().unwrap();
    let a = rt.register(vec![0u8]);
    let c = Arc::new(Codelet::new("c").cpu(|_| Ok(())));
    let e = rt
        .task(&c)
        .rw(&a)
        .read(&a)
        .submit()
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("accessed twice"), "{e}");
    let gpu_only = Arc::new(Codelet::new("gpu_only").cuda(|_| Ok(())));
    let e = rt
        .task(&gpu_only)
        .read(&a)
        .submit()
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no implementation"), "{e}");
}

#[test]
fn objects_are_host_data() {
    let rt = Runtime::builder().cpus(2).model_path(None).build().unwrap();
    let m = rt.register_object(std::collections::BTreeMap::<String, u32>::new());
    let put = Arc::new(Codelet::new("put").cpu(|ctx| {
        let m = ctx.object_mut::<std::collections::BTreeMap<String, u32>>(0);
        let n = m.len() as u32;
        m.insert(format!("k{n}"), n);
        Ok(())
    }));
    for _ in 0..10 {
        rt.task(&put).rw(&m).submit().unwrap();
    }
    let m = rt.unregister(m).unwrap();
    assert_eq!(m.len(), 10);
    assert_eq!(m["k9"], 9);
}

/// Plain data keeps its size and place while registered (device replicas and pinned host
/// memory rely on it): a codelet that asks for the vector itself to grow it fails, and the
/// data is unchanged.
#[test]
fn plain_data_cannot_be_resized_through_object_mut() {
    let rt = Runtime::builder().cpus(1).model_path(None).build().unwrap();
    let v = rt.register(vec![1.0f32; 8]);
    let grow = Arc::new(Codelet::new("grow").cpu(|ctx| {
        ctx.object_mut::<Vec<f32>>(0).push(2.0);
        Ok(())
    }));
    rt.task(&grow).rw(&v).submit().unwrap();
    let e = rt.wait_all().unwrap_err().to_string();
    assert!(e.contains("data_mut"), "{e}");
    // The failed task's data is stale (a failed writer's data is never handed back)...
    assert!(rt.read(&v).is_err());
    // ... and its vector kept its size: written whole, it is the 8 elements it was.
    let fill = Arc::new(Codelet::new("fill").cpu(|ctx| {
        ctx.data_mut::<f32>(0).fill(3.0);
        Ok(())
    }));
    rt.task(&fill).write(&v).submit().unwrap();
    assert_eq!(rt.unregister(v).unwrap(), vec![3.0f32; 8]);
}

/// A task of more than 64 data: each datum's borrows are its own (data 0 and 64 once
/// shared one mark, and reading one then writing the other panicked as a double borrow),
/// and borrowing one mutably twice is still refused.
#[test]
fn a_task_of_more_than_64_data_borrows_each_on_its_own() {
    let rt = Runtime::builder().cpus(1).model_path(None).build().unwrap();
    let data: Vec<_> = (0..70u64).map(|i| rt.register(vec![i])).collect();
    let sum = Arc::new(Codelet::new("sum").cpu(|ctx| {
        let s: u64 = (0..64).map(|i| ctx.data::<u64>(i)[0]).sum();
        for j in 64..ctx.len() {
            ctx.data_mut::<u64>(j)[0] += s;
        }
        Ok(())
    }));
    let mut t = rt.task(&sum);
    for (i, d) in data.iter().enumerate() {
        t = if i < 64 { t.read(d) } else { t.rw(d) };
    }
    t.submit().unwrap();
    rt.wait_all().unwrap();
    let s: u64 = (0..64).sum();
    let got: Vec<u64> = data[64..].iter().map(|d| rt.read(d).unwrap()[0]).collect();
    assert_eq!(got, (64..70).map(|j| j + s).collect::<Vec<_>>());
    let twice = Arc::new(Codelet::new("twice").cpu(|ctx| {
        let _a = ctx.data_mut::<u64>(65);
        let _b = ctx.data_mut::<u64>(65);
        Ok(())
    }));
    let mut t = rt.task(&twice);
    for (i, d) in data.iter().enumerate() {
        t = if i < 64 { t.read(d) } else { t.rw(d) };
    }
    t.submit().unwrap();
    let err = rt.wait_all().unwrap_err().to_string();
    assert!(
        err.contains("data 65 borrowed mutably more than once"),
        "{err}"
    );
}
