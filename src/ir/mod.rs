//! The IR: a dataflow graph of tensor operations.
//!
//! # What a graph means
//!
//! A [`Graph`] is a set of [`Node`]s. Each node applies an [`Op`] to its
//! operands (other nodes, in slot order) and produces one tensor of the
//! node's [`Shape`] and [`DType`]. Nodes are pure: a node's value depends
//! only on its op and its operands' values, so any two nodes with equal op
//! and operands are interchangeable, and a node nobody needs may be dropped.
//! Random nodes are pure too: their values are a function of the run's seed
//! and the node's stream (counter-based random numbers).
//!
//! Views (`reshape`, `permute`, `expand`, `slice`) are values like any
//! other: a backend may implement them as a new layout over the same bytes,
//! but no op ever writes through a view, so aliasing is never observable.
//!
//! Variables and assignments are not ops. A graph is a pure function of
//! its inputs: a variable's value enters as an `input` like any realized
//! buffer, and an assignment is one more output, whose buffer the context
//! makes the variable's value after the run (so every read of a plan sees
//! the values from before it, and every assignment lands after it). Which
//! outputs are assignments is the context's business; a backend may write
//! such an output over the input it replaces (buffer donation) without the
//! graph saying so.
//!
//! Gradients are plain nodes too: `passes::autodiff` records them in
//! `grad/<region>` regions, and they are fused and planned with the rest.
//!
//! Elementwise ops take operands of exactly their own shape; broadcasting
//! is an explicit `expand`. The graph's outputs are the values its caller
//! asked for. Regions ([`Region`]) form a tree that names and groups nodes;
//! they never change what a node computes.
//!
//! # Invariants
//!
//! `ir` imports nothing from `passes`, `backends` or the user API. A graph
//! that passed [`verify`] is acyclic, every operand count and type agrees
//! with [`infer`], and every region and output exists.

pub mod dot;
mod dtype;
pub mod eval;
pub mod fast_math;
pub mod fused;
mod graph;
mod infer;
pub(crate) mod lifetimes;
mod op;
pub mod plan;
mod plan_check;
mod shape;
pub mod text;
mod verify;

pub use dtype::{DType, Element, HostData, Scalar};
pub use fused::{FusedBody, FusedKind, Padded};
pub use graph::{Graph, Node, NodeId, NodeSet, Phase, Region, RegionAutocast, RegionId};
pub use infer::{infer, mixed, window_out};
pub use op::{
    AttnLayout, AttnMask, AttnWrt, BinaryOp, BufferId, Collective, CompareOp, Distribution, Op, PoolKind,
    ReduceOp, UnaryOp,
};
pub use plan::{
    Event, EventId, GroupKind, LaunchGroup, MemoryPlan, Placement, Plan, PlanTables, StreamId, StreamPlan,
    ValueMemory,
};
pub use shape::Shape;
pub use verify::{extra_outputs, extra_type, verify};
