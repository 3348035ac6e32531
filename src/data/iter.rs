//! Iterator adaptors for feeding a model: `shuffled`, `batch`, `collate`,
//! `stack`. They are methods of [`IteratorExt`], implemented for every
//! iterator, so they chain on a [`super::Dataset`]'s samples and on plain
//! iterators alike (dfdx's data utilities, on kiln tensors).

use super::Rng;
use crate::{Context, Element, Error, Location, Result, Tensor};

/// The adaptors, for every iterator.
pub trait IteratorExt: Iterator + Sized {
    /// The items in a random order (all of them are collected first).
    fn shuffled(self, rng: &mut Rng) -> std::vec::IntoIter<Self::Item> {
        let mut items: Vec<Self::Item> = self.collect();
        rng.shuffle(&mut items);
        items.into_iter()
    }

    /// Groups of `n` items (`Vec`s); the last group has the rest (fewer
    /// than `n`). `n == 0` is treated as 1.
    fn batch(self, n: usize) -> Batch<Self> {
        Batch { inner: self, size: n.max(1), exact: false }
    }

    /// Groups of exactly `n` items; a last group of fewer is dropped
    /// (every batch then has one shape, so one compiled plan).
    fn batch_exact(self, n: usize) -> Batch<Self> {
        Batch { inner: self, size: n.max(1), exact: true }
    }

    /// Turns each group of pairs `Vec<(A, B)>` into a pair of groups
    /// `(Vec<A>, Vec<B>)` (inputs and targets).
    fn collate<A, B>(self) -> Collate<Self>
    where
        Self: Iterator<Item = Vec<(A, B)>>,
    {
        Collate { inner: self }
    }

    /// Turns each group into tensors on `ctx` ([`Stackable`]): rows
    /// become a `[n, len]` tensor, numbers a `[n]` tensor, a pair a pair.
    fn stack(self, ctx: &Context) -> StackIter<Self>
    where
        Self::Item: Stackable,
    {
        StackIter { inner: self, ctx: ctx.clone() }
    }
}

impl<I: Iterator> IteratorExt for I {}

/// See [`IteratorExt::batch`].
#[derive(Clone, Debug)]
pub struct Batch<I> {
    inner: I,
    size: usize,
    exact: bool,
}

impl<I: Iterator> Iterator for Batch<I> {
    type Item = Vec<I::Item>;

    fn next(&mut self) -> Option<Vec<I::Item>> {
        let group: Vec<I::Item> = self.inner.by_ref().take(self.size).collect();
        if group.is_empty() || (self.exact && group.len() < self.size) {
            return None;
        }
        Some(group)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let (lo, hi) = self.inner.size_hint();
        let count = |n: usize| if self.exact { n / self.size } else { n.div_ceil(self.size) };
        (count(lo), hi.map(count))
    }
}

/// See [`IteratorExt::collate`].
#[derive(Clone, Debug)]
pub struct Collate<I> {
    inner: I,
}

impl<A, B, I: Iterator<Item = Vec<(A, B)>>> Iterator for Collate<I> {
    type Item = (Vec<A>, Vec<B>);

    fn next(&mut self) -> Option<(Vec<A>, Vec<B>)> {
        self.inner.next().map(|group| group.into_iter().unzip())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

/// See [`IteratorExt::stack`].
#[derive(Clone)]
pub struct StackIter<I> {
    inner: I,
    ctx: Context,
}

impl<I: Iterator> Iterator for StackIter<I>
where
    I::Item: Stackable,
{
    type Item = Result<<I::Item as Stackable>::Output>;

    /// A misfit group's error names the caller's line (a closure here
    /// would not pass `track_caller` on).
    #[track_caller]
    fn next(&mut self) -> Option<Self::Item> {
        let group = self.inner.next()?;
        Some(group.stack(&self.ctx))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

/// A group of host values that becomes tensors (one upload per tensor).
pub trait Stackable {
    /// What it becomes.
    type Output;
    /// Copies the group to `ctx`.
    fn stack(self, ctx: &Context) -> Result<Self::Output>;
}

/// Also a free function, for one group: `stack(&ctx, rows)`.
#[track_caller]
pub fn stack<S: Stackable>(ctx: &Context, group: S) -> Result<S::Output> {
    group.stack(ctx)
}

#[track_caller]
fn rows<T: Element, R: AsRef<[T]>>(ctx: &Context, group: &[R]) -> Result<Tensor> {
    let len = group.first().map_or(0, |r| r.as_ref().len());
    if let Some((i, r)) = group.iter().enumerate().find(|(_, r)| r.as_ref().len() != len) {
        return Err(Error::Shape {
            op: "stack",
            message: format!(
                "rows of one batch must have one length: row 0 has {len} value(s), row {i} has {}",
                r.as_ref().len()
            ),
            location: Location::caller(),
        });
    }
    let mut flat = Vec::with_capacity(group.len() * len);
    for r in group {
        flat.extend_from_slice(r.as_ref());
    }
    let t = ctx.tensor(&flat, [group.len(), len]);
    match t.error() {
        Some(e) => Err(e.clone()),
        None => Ok(t),
    }
}

impl<T: Element> Stackable for Vec<&[T]> {
    type Output = Tensor;
    #[track_caller]
    fn stack(self, ctx: &Context) -> Result<Tensor> {
        rows(ctx, &self)
    }
}

impl<T: Element> Stackable for Vec<Vec<T>> {
    type Output = Tensor;
    #[track_caller]
    fn stack(self, ctx: &Context) -> Result<Tensor> {
        rows(ctx, &self)
    }
}

macro_rules! stack_numbers {
    ($($t:ty)*) => {$(
        impl Stackable for Vec<$t> {
            type Output = Tensor;
            #[track_caller]
            fn stack(self, ctx: &Context) -> Result<Tensor> {
                let t = ctx.tensor(&self, [self.len()]);
                match t.error() {
                    Some(e) => Err(e.clone()),
                    None => Ok(t),
                }
            }
        }
    )*};
}

stack_numbers!(f32 f64 i32 i64 u8 bool);

impl<A: Stackable, B: Stackable> Stackable for (A, B) {
    type Output = (A::Output, B::Output);
    #[track_caller]
    fn stack(self, ctx: &Context) -> Result<(A::Output, B::Output)> {
        Ok((self.0.stack(ctx)?, self.1.stack(ctx)?))
    }
}
