//! The closure API: spawn, scope, parallel_for with every schedule.

#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use flotilla_runtime::{Runtime, Schedule};

fn rt() -> Runtime {
    Runtime::builder().cpus(3).model_path(None).build().unwrap()
}

#[test]
fn scope_runs_every_spawn_and_borrows_the_stack() {
    let rt = rt();
    let counter = AtomicUsize::new(0);
    let mut out = vec![0u64; 1000];
    rt.scope(|s| {
        for (i, slot) in out.iter_mut().enumerate() {
            let counter = &counter;
            s.spawn(move |_| {
                *slot = (i as u64) * 2;
                counter.fetch_add(1, Ordering::Relaxed);
            });
        }
    });
    assert_eq!(counter.load(Ordering::Relaxed), 1000);
    assert!(out.iter().enumerate().all(|(i, v)| *v == i as u64 * 2));
}

#[test]
fn nested_scopes_and_spawns_inside_spawns() {
    let rt = rt();
    let counter = AtomicUsize::new(0);
    rt.scope(|s| {
        for _ in 0..10 {
            s.spawn(|s| {
                for _ in 0..10 {
                    s.spawn(|_| {
                        counter.fetch_add(1, Ordering::Relaxed);
                    });
                }
            });
        }
    });
    assert_eq!(counter.load(Ordering::Relaxed), 100);
}

#[test]
fn panic_in_a_spawn_reaches_the_scope_after_the_others_finish() {
    let rt = rt();
    let counter = AtomicUsize::new(0);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.scope(|s| {
            for i in 0..50 {
                let counter = &counter;
                s.spawn(move |_| {
                    if i == 7 {
                        panic!("seven");
                    }
                    counter.fetch_add(1, Ordering::Relaxed);
                });
            }
        })
    }));
    assert!(r.is_err());
    assert_eq!(counter.load(Ordering::Relaxed), 49);
    // The pool still works.
    let n = AtomicUsize::new(0);
    rt.parallel_for(0..100, Schedule::Static, |_| {
        n.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(n.load(Ordering::Relaxed), 100);
}

#[test]
fn parallel_for_visits_each_index_once_for_every_schedule() {
    let rt = rt();
    for schedule in [
        Schedule::Static,
        Schedule::Dynamic(1),
        Schedule::Dynamic(7),
        Schedule::Guided(1),
        Schedule::Guided(16),
    ] {
        for len in [0usize, 1, 5, 1000, 4097] {
            let hits: Vec<AtomicUsize> = (0..len).map(|_| AtomicUsize::new(0)).collect();
            rt.parallel_for(10..10 + len, schedule, |i| {
                hits[i - 10].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "{schedule:?} len {len}"
            );
        }
    }
}

#[test]
fn spawn_runs_detached() {
    let rt = rt();
    let (tx, rx) = mpsc::channel();
    for i in 0..100 {
        let tx = tx.clone();
        rt.spawn(move || tx.send(i).unwrap());
    }
    let mut got: Vec<i32> = (0..100).map(|_| rx.recv().unwrap()).collect();
    got.sort();
    assert_eq!(got, (0..100).collect::<Vec<_>>());
}

#[test]
fn work_is_spread_over_workers() {
    let rt = rt();
    let seen = std::sync::Mutex::new(std::collections::HashSet::new());
    rt.parallel_for(0..64, Schedule::Dynamic(1), |_| {
        seen.lock().unwrap().insert(std::thread::current().id());
        std::thread::sleep(std::time::Duration::from_millis(2));
    });
    assert!(seen.lock().unwrap().len() >= 2);
}
