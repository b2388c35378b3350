//! `flotilla alloc`: worker allocations asked of a batch system. The policy (how many, when
//! to give back) is [`flotilla_sched::alloc`]; this module holds the queues and their
//! allocations ([`queues`]), the allocator that acts on them ([`allocator`]) and the batch
//! systems' side ([`slurm`], which also holds what every batch system shares, and [`pbs`]).

pub mod allocator;
pub mod pbs;
pub mod queues;
pub mod slurm;

pub use allocator::{Allocator, BatchSystem, CoreView, Pbs, Slurm, Systems};
pub use queues::{AllocError, AllocState, Allocation, Queue, QueueSpec};
