//! A generator for the task DAG of a tiled, right-looking Cholesky factorization
//! `A = L L^T` of an `nt x nt` grid of tiles, on a platform of CPU cores and GPUs.
//!
//! For each step `k`: `potrf(k)` factors the diagonal tile `A[k][k]`; `trsm(i,k)` solves
//! `A[i][k]` for each `i > k`; then the trailing matrix is updated, `syrk(i,k)` on each
//! diagonal tile `A[i][i]` and `gemm(i,j,k)` on each `A[i][j]`, `k < j < i`. Tasks are
//! listed in that (sequential) order and edges follow the tiles: a task depends on the last
//! writer of every tile it reads or updates, carrying one tile of data per tile (so a gemm
//! has three inputs). No write-after-read edges are needed: in this algorithm a tile is
//! never written again after it is first read by another task.
//!
//! Task ids are `potrf_k`, `trsm_i_k`, `syrk_i_k`, `gemm_i_j_k`; the task's `kind` is the
//! kernel name. Processors are `cpu0..` then `gpu0..`. The DAG format has one bandwidth
//! for every pair of processors, so moving a tile between two CPU cores costs as much as
//! moving it to a GPU: a pessimistic model of a shared-memory host.

use std::collections::BTreeMap;

use crate::dag::{Dag, DagSpec, EdgeSpec, TaskSpec};
use crate::error::Result;

/// Seconds per kernel call on one processor, for one tile.
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct KernelCosts {
    /// Factor a diagonal tile.
    pub potrf: f64,
    /// Triangular solve of a panel tile.
    pub trsm: f64,
    /// Symmetric rank-b update of a diagonal tile.
    pub syrk: f64,
    /// General update of an off-diagonal tile.
    pub gemm: f64,
}

impl KernelCosts {
    /// One CPU core on 960x960 double tiles (about 30 GFLOP/s in gemm: `2 b^3` flops in
    /// 60 ms; potrf at `b^3/3` flops runs at ~20 GFLOP/s).
    pub const CPU_CORE_960: KernelCosts = KernelCosts {
        potrf: 0.015,
        trsm: 0.032,
        syrk: 0.030,
        gemm: 0.060,
    };

    /// A data-center GPU on the same tiles: gemm 20x a CPU core, trsm ~9x, syrk 12x, and
    /// potrf *slower* than on a CPU core (small, sequential, latency-bound).
    pub const GPU_960: KernelCosts = KernelCosts {
        potrf: 0.020,
        trsm: 0.0035,
        syrk: 0.0025,
        gemm: 0.003,
    };
}

/// The machine a Cholesky DAG is generated for.
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct CholeskyPlatform {
    /// How many CPU processors (`cpu0..`).
    pub n_cpu: usize,
    /// How many GPU processors (`gpu0..`).
    pub n_gpu: usize,
    /// Kernel costs on a CPU processor.
    pub cpu: KernelCosts,
    /// Kernel costs on a GPU processor.
    pub gpu: KernelCosts,
    /// Bytes per tile.
    pub tile_bytes: u64,
    /// Bytes per second between two processors.
    pub bandwidth: f64,
}

impl CholeskyPlatform {
    /// `n_cpu` CPU cores and `n_gpu` GPUs with 960x960 double tiles (7.4 MB), the costs of
    /// [`KernelCosts::CPU_CORE_960`] and [`KernelCosts::GPU_960`], and 12 GB/s between
    /// processors (PCIe 4.0 x16 in practice), so a tile moves in 0.6 ms.
    pub fn new(n_cpu: usize, n_gpu: usize) -> Self {
        CholeskyPlatform {
            n_cpu,
            n_gpu,
            cpu: KernelCosts::CPU_CORE_960,
            gpu: KernelCosts::GPU_960,
            tile_bytes: 960 * 960 * 8,
            bandwidth: 12e9,
        }
    }

    fn costs(&self, kernel: Kernel) -> Vec<f64> {
        let pick = |k: &KernelCosts| match kernel {
            Kernel::Potrf => k.potrf,
            Kernel::Trsm => k.trsm,
            Kernel::Syrk => k.syrk,
            Kernel::Gemm => k.gemm,
        };
        let mut c = vec![pick(&self.cpu); self.n_cpu];
        c.extend(std::iter::repeat_n(pick(&self.gpu), self.n_gpu));
        c
    }
}

#[derive(Clone, Copy)]
enum Kernel {
    Potrf,
    Trsm,
    Syrk,
    Gemm,
}

impl Kernel {
    fn name(self) -> &'static str {
        match self {
            Kernel::Potrf => "potrf",
            Kernel::Trsm => "trsm",
            Kernel::Syrk => "syrk",
            Kernel::Gemm => "gemm",
        }
    }
}

/// The number of tasks of an `nt x nt` tiled Cholesky: `nt` potrf, `nt(nt-1)/2` trsm and
/// syrk each, `nt(nt-1)(nt-2)/6` gemm.
pub fn cholesky_task_count(nt: usize) -> usize {
    nt + nt * nt.saturating_sub(1) + nt * nt.saturating_sub(1) * nt.saturating_sub(2) / 6
}

/// The DAG of an `nt x nt` tiled Cholesky on `platform` (see the [module docs](self)).
/// Fails only when the platform has no processor or a cost or bandwidth the DAG rejects.
pub fn cholesky_dag(nt: usize, platform: &CholeskyPlatform) -> Result<Dag> {
    let mut tasks = Vec::with_capacity(cholesky_task_count(nt));
    // Last writer (task index) of tile (i, j), i >= j.
    let mut writer: Vec<Option<usize>> = vec![None; nt * nt];
    // (from, to) -> number of tiles carried.
    let mut edges: BTreeMap<(usize, usize), u64> = BTreeMap::new();
    let mut add = |kernel: Kernel, id: String, reads: &[(usize, usize)], writes: (usize, usize)| {
        let t = tasks.len();
        tasks.push(TaskSpec {
            id,
            cost: platform.costs(kernel),
            kind: Some(kernel.name().to_owned()),
        });
        for &(i, j) in reads.iter().chain(std::iter::once(&writes)) {
            if let Some(w) = writer[i * nt + j] {
                *edges.entry((w, t)).or_default() += 1;
            }
        }
        writer[writes.0 * nt + writes.1] = Some(t);
    };
    for k in 0..nt {
        add(Kernel::Potrf, format!("potrf_{k}"), &[], (k, k));
        for i in k + 1..nt {
            add(Kernel::Trsm, format!("trsm_{i}_{k}"), &[(k, k)], (i, k));
        }
        for i in k + 1..nt {
            add(Kernel::Syrk, format!("syrk_{i}_{k}"), &[(i, k)], (i, i));
            for j in k + 1..i {
                add(
                    Kernel::Gemm,
                    format!("gemm_{i}_{j}_{k}"),
                    &[(i, k), (j, k)],
                    (i, j),
                );
            }
        }
    }
    let edges = edges
        .into_iter()
        .map(|((from, to), tiles)| EdgeSpec {
            from: tasks[from].id.clone(),
            to: tasks[to].id.clone(),
            data: (tiles * platform.tile_bytes) as f64,
        })
        .collect();
    let processors = (0..platform.n_cpu)
        .map(|i| format!("cpu{i}"))
        .chain((0..platform.n_gpu).map(|i| format!("gpu{i}")))
        .collect();
    Dag::from_spec(DagSpec {
        processors,
        bandwidth: platform.bandwidth,
        tasks,
        edges,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dag::DagSpec;
    use crate::error::SchedError;
    use crate::policy::PolicyKind;
    use crate::sim::simulate;

    #[test]
    fn has_the_expected_tasks_and_dependencies() {
        let dag = cholesky_dag(4, &CholeskyPlatform::new(2, 1)).unwrap();
        assert_eq!(dag.tasks().len(), cholesky_task_count(4));
        assert_eq!(dag.tasks().len(), 4 + 6 + 6 + 4);
        assert_eq!(dag.processors(), ["cpu0", "cpu1", "gpu0"]);
        let t = |id: &str| dag.task_index(id).unwrap();
        let preds = |id: &str| {
            let mut p: Vec<&str> = dag
                .in_edges(t(id))
                .iter()
                .map(|&e| dag.tasks()[dag.edges()[e].from].id.as_str())
                .collect();
            p.sort_unstable();
            p
        };
        assert!(preds("potrf_0").is_empty());
        assert_eq!(preds("trsm_2_0"), ["potrf_0"]);
        assert_eq!(preds("syrk_2_0"), ["trsm_2_0"]);
        assert_eq!(preds("gemm_3_1_0"), ["trsm_1_0", "trsm_3_0"]);
        assert_eq!(preds("potrf_1"), ["syrk_1_0"]);
        assert_eq!(preds("gemm_3_2_1"), ["gemm_3_2_0", "trsm_2_1", "trsm_3_1"]);
        assert_eq!(preds("syrk_3_2"), ["syrk_3_1", "trsm_3_2"]);
        let gemm = &dag.tasks()[t("gemm_3_2_1")];
        assert_eq!(gemm.kind.as_deref(), Some("gemm"));
        assert_eq!(gemm.cost, [0.060, 0.060, 0.003]);
        assert!(dag.edges().iter().all(|e| e.data == 7_372_800.0));
        assert_eq!(cholesky_task_count(12), 12 + 66 + 66 + 220);
        assert_eq!(
            cholesky_dag(12, &CholeskyPlatform::new(1, 0))
                .unwrap()
                .tasks()
                .len(),
            364
        );
    }

    #[test]
    fn no_processor_is_an_error_and_no_tiles_is_empty() {
        assert!(matches!(
            cholesky_dag(3, &CholeskyPlatform::new(0, 0)),
            Err(SchedError::NoProcessors)
        ));
        assert!(cholesky_dag(0, &CholeskyPlatform::new(1, 1))
            .unwrap()
            .tasks()
            .is_empty());
    }

    #[test]
    fn dmda_is_never_worse_than_eager() {
        for (n_cpu, n_gpu) in [(2, 0), (2, 1), (4, 2)] {
            for nt in [4, 8, 12] {
                let dag = cholesky_dag(nt, &CholeskyPlatform::new(n_cpu, n_gpu)).unwrap();
                let dmda = simulate(&dag, PolicyKind::Dmda, 1).unwrap();
                let eager = simulate(&dag, PolicyKind::Eager, 1).unwrap();
                dmda.validate(&dag).unwrap();
                eager.validate(&dag).unwrap();
                eprintln!(
                    "cholesky nt={nt} cpu={n_cpu} gpu={n_gpu}: dmda {:.4} eager {:.4} heft {:.4} ws {:.4}",
                    dmda.makespan,
                    eager.makespan,
                    simulate(&dag, PolicyKind::Heft, 1).unwrap().makespan,
                    simulate(&dag, PolicyKind::Ws, 1).unwrap().makespan,
                );
                assert!(
                    dmda.makespan <= eager.makespan * (1.0 + 1e-9),
                    "nt={nt} cpu={n_cpu} gpu={n_gpu}: dmda {} > eager {}",
                    dmda.makespan,
                    eager.makespan
                );
            }
        }
    }

    /// `n` independent tasks costing `cpu` on a CPU and `gpu` on a GPU.
    fn sweep(n: usize, cpu: f64, gpu: f64, n_cpu: usize, n_gpu: usize) -> Dag {
        let mut cost = vec![cpu; n_cpu];
        cost.extend(std::iter::repeat_n(gpu, n_gpu));
        Dag::from_spec(DagSpec {
            processors: (0..n_cpu)
                .map(|i| format!("cpu{i}"))
                .chain((0..n_gpu).map(|i| format!("gpu{i}")))
                .collect(),
            bandwidth: 1e9,
            tasks: (0..n)
                .map(|i| TaskSpec {
                    id: format!("s{i}"),
                    cost: cost.clone(),
                    kind: None,
                })
                .collect(),
            edges: vec![],
        })
        .unwrap()
    }

    #[test]
    fn a_sweep_finishes_sooner_on_cpus_and_gpu_together_with_dmda() {
        // 200 tasks, 10 s on a CPU core, 2 s on the GPU: 4 cores alone need 500 s, the GPU
        // alone 400 s; together ~0.9 tasks/s, ~222 s.
        let (n, cpu, gpu) = (200, 10.0, 2.0);
        let both = simulate(&sweep(n, cpu, gpu, 4, 1), PolicyKind::Dmda, 0).unwrap();
        let cpus = simulate(&sweep(n, cpu, gpu, 4, 0), PolicyKind::Dmda, 0).unwrap();
        let gpus = simulate(&sweep(n, cpu, gpu, 0, 1), PolicyKind::Dmda, 0).unwrap();
        assert_eq!(cpus.makespan, 500.0);
        assert_eq!(gpus.makespan, 400.0);
        assert!(both.makespan < cpus.makespan && both.makespan < gpus.makespan);
        // And close to the combined throughput bound.
        let bound = n as f64 / (4.0 / cpu + 1.0 / gpu);
        assert!(
            both.makespan <= bound + cpu,
            "{} vs bound {bound}",
            both.makespan
        );
        let on_gpu = both
            .placements
            .iter()
            .filter(|p| p.processor == "gpu0")
            .count();
        assert!(on_gpu > n / 2, "the GPU takes most tasks: {on_gpu}");
    }
}
