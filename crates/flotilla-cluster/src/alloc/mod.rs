//! `flotilla alloc`: worker allocations asked of a batch system. The policy (how many, when
//! to give back) is [`flotilla_sched::alloc`]; this module holds the batch systems' side
//! ([`slurm`]).

pub mod slurm;
