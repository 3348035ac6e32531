//! Shapes as types: a dim is `Const<N>` (known to the compiler) or
//! `usize` (known when the program runs), a shape is a tuple of dims, and
//! traits on those tuples say which ops fit (broadcasting, matmul,
//! reductions, permutations, concatenation).
//!
//! Every rule that can be a trait impl is one, so a misfit is a type
//! error that names both shapes. What needs arithmetic on const generics
//! (`generic_const_exprs`, unstable) is not a trait here: a reshape's
//! element count and a flatten's width are checked by a const assertion
//! when the function is instantiated (`cargo build`, not `cargo check`),
//! conv and pooling output sizes come from a table (see `super::conv`),
//! and concatenating two `Const` dims gives a `usize` dim.

use std::fmt::Debug;

/// A dimension whose size is part of the type: `Const<784>`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Const<const N: usize>;

/// One dimension of a shape: [`Const<N>`] (compile time) or `usize`
/// (run time).
pub trait Dim: Copy + Debug + Send + Sync + 'static {
    /// `Some(N)` for `Const<N>`, `None` for a runtime dim.
    const CONST: Option<usize>;
    /// The size.
    fn size(&self) -> usize;
    /// The dim of size `n`, if this dim type can have that size.
    fn from_size(n: usize) -> Option<Self>;
    /// The type as written (`Const<3>`, `usize`), for error messages.
    fn type_text() -> String {
        match Self::CONST {
            Some(n) => format!("Const<{n}>"),
            None => "usize".into(),
        }
    }
}

impl Dim for usize {
    const CONST: Option<usize> = None;
    fn size(&self) -> usize {
        *self
    }
    fn from_size(n: usize) -> Option<usize> {
        Some(n)
    }
}

impl<const N: usize> Dim for Const<N> {
    const CONST: Option<usize> = Some(N);
    fn size(&self) -> usize {
        N
    }
    fn from_size(n: usize) -> Option<Self> {
        (n == N).then_some(Const)
    }
}

/// A dim known at compile time.
pub trait ConstDim: Dim + Default {
    /// Its size.
    const SIZE: usize;
}

impl<const N: usize> ConstDim for Const<N> {
    const SIZE: usize = N;
}

/// A tuple of dims: `()`, `(D0,)`, ... up to rank 4.
pub trait Shape: Copy + Debug + Send + Sync + 'static {
    /// The rank.
    const RANK: usize;
    /// The element count when every dim is `Const`, else `None`.
    const CONST_NUMEL: Option<usize>;
    /// The sizes, outermost first.
    fn dims(&self) -> Vec<usize>;
    /// The shape with these sizes, if its dim types allow them (the rank
    /// matches and every `Const` dim has its size).
    fn from_dims(dims: &[usize]) -> Option<Self>;
    /// The element count.
    fn numel(&self) -> usize {
        self.dims().iter().product()
    }
    /// The type as written (`(Const<3>, usize)`), for error messages.
    fn type_text() -> String;
}

/// A shape whose dims are all `Const`: its value is `Default::default()`.
pub trait ConstShape: Shape + Default {
    /// The element count.
    const NUMEL: usize;
}

const fn numel_of(dims: &[Option<usize>]) -> Option<usize> {
    let mut n = 1usize;
    let mut i = 0;
    while i < dims.len() {
        match dims[i] {
            Some(d) => n = n.saturating_mul(d),
            None => return None,
        }
        i += 1;
    }
    Some(n)
}

macro_rules! shapes {
    ($($rank:literal: ($($d:ident $i:tt),*);)*) => {$(
        impl<$($d: Dim),*> Shape for ($($d,)*) {
            const RANK: usize = $rank;
            const CONST_NUMEL: Option<usize> = numel_of(&[$($d::CONST),*]);
            fn dims(&self) -> Vec<usize> {
                vec![$(self.$i.size()),*]
            }
            #[allow(unused_variables, unused_mut)]
            fn from_dims(dims: &[usize]) -> Option<Self> {
                if dims.len() != $rank {
                    return None;
                }
                let mut it = dims.iter();
                Some(($($d::from_size(*it.next()?)?,)*))
            }
            fn type_text() -> String {
                let dims: Vec<String> = vec![$($d::type_text()),*];
                if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) }
            }
        }
        impl<$($d: ConstDim),*> ConstShape for ($($d,)*) {
            const NUMEL: usize = 1 $(* $d::SIZE)*;
        }
    )*};
}

shapes! {
    0: ();
    1: (D0 0);
    2: (D0 0, D1 1);
    3: (D0 0, D1 1, D2 2);
    4: (D0 0, D1 1, D2 2, D3 3);
}

/// A scalar's shape.
pub type Rank0 = ();
/// `[M]`, known at compile time.
pub type Rank1<const M: usize> = (Const<M>,);
/// `[M, N]`, known at compile time.
pub type Rank2<const M: usize, const N: usize> = (Const<M>, Const<N>);
/// `[M, N, O]`, known at compile time.
pub type Rank3<const M: usize, const N: usize, const O: usize> = (Const<M>, Const<N>, Const<O>);
/// `[M, N, O, P]`, known at compile time.
pub type Rank4<const M: usize, const N: usize, const O: usize, const P: usize> =
    (Const<M>, Const<N>, Const<O>, Const<P>);

/// Axis `I` of a shape, as a type: `t.sum::<Axis<1>>()`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Axis<const I: usize>;

/// A permutation of two axes: `Axes2<1, 0>` (the order of the result).
#[derive(Clone, Copy, Debug, Default)]
pub struct Axes2<const A: usize, const B: usize>;
/// A permutation of three axes: `Axes3<0, 2, 1>`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Axes3<const A: usize, const B: usize, const C: usize>;
/// A permutation of four axes: `Axes4<0, 2, 3, 1>` (NCHW to NHWC).
#[derive(Clone, Copy, Debug, Default)]
pub struct Axes4<const A: usize, const B: usize, const C: usize, const D: usize>;

/// Shapes that broadcast together, numpy's rule restricted to what the
/// types decide: equal shapes, or one shape a suffix of the other (a
/// bias `(Const<10>,)` over a batch `(usize, Const<10>)`). A dim of
/// size 1 does not stretch: `(Const<1>, Const<5>)` and
/// `(Const<3>, Const<5>)` do not broadcast here (broadcast explicitly
/// with [`super::Tensor::broadcast_to`] after a reshape).
#[diagnostic::on_unimplemented(
    message = "shapes `{Self}` and `{Rhs}` do not broadcast",
    label = "the shapes must be equal, or one a suffix of the other",
    note = "kiln::typed broadcasts by type: equal dims, aligned from the right, of the same dim type (Const<N> or usize)"
)]
pub trait BroadcastShapes<Rhs: Shape>: Shape {
    /// The shape of the result: the longer one.
    type Output: Shape;
    /// Its value, from the two operands' shapes.
    fn broadcast(lhs: &Self, rhs: &Rhs) -> Self::Output;
}

macro_rules! broadcast {
    // Rhs is a suffix of Self (same rank included).
    (long ($($d:ident $i:tt),*) short ($($s:ident),*)) => {
        #[diagnostic::do_not_recommend]
        impl<$($d: Dim),*> BroadcastShapes<($($s,)*)> for ($($d,)*) {
            type Output = ($($d,)*);
            fn broadcast(lhs: &Self, _: &($($s,)*)) -> Self::Output {
                *lhs
            }
        }
    };
    // Self is a strict suffix of Rhs.
    (short ($($s:ident),*) long ($($d:ident $i:tt),*)) => {
        #[diagnostic::do_not_recommend]
        impl<$($d: Dim),*> BroadcastShapes<($($d,)*)> for ($($s,)*) {
            type Output = ($($d,)*);
            fn broadcast(_: &Self, rhs: &($($d,)*)) -> Self::Output {
                *rhs
            }
        }
    };
}

broadcast!(long () short ());
broadcast!(long (D0 0) short ());
broadcast!(long (D0 0) short (D0));
broadcast!(long (D0 0, D1 1) short ());
broadcast!(long (D0 0, D1 1) short (D1));
broadcast!(long (D0 0, D1 1) short (D0, D1));
broadcast!(long (D0 0, D1 1, D2 2) short ());
broadcast!(long (D0 0, D1 1, D2 2) short (D2));
broadcast!(long (D0 0, D1 1, D2 2) short (D1, D2));
broadcast!(long (D0 0, D1 1, D2 2) short (D0, D1, D2));
broadcast!(long (D0 0, D1 1, D2 2, D3 3) short ());
broadcast!(long (D0 0, D1 1, D2 2, D3 3) short (D3));
broadcast!(long (D0 0, D1 1, D2 2, D3 3) short (D2, D3));
broadcast!(long (D0 0, D1 1, D2 2, D3 3) short (D1, D2, D3));
broadcast!(long (D0 0, D1 1, D2 2, D3 3) short (D0, D1, D2, D3));
broadcast!(short () long (D0 0));
broadcast!(short () long (D0 0, D1 1));
broadcast!(short (D1) long (D0 0, D1 1));
broadcast!(short () long (D0 0, D1 1, D2 2));
broadcast!(short (D2) long (D0 0, D1 1, D2 2));
broadcast!(short (D1, D2) long (D0 0, D1 1, D2 2));
broadcast!(short () long (D0 0, D1 1, D2 2, D3 3));
broadcast!(short (D3) long (D0 0, D1 1, D2 2, D3 3));
broadcast!(short (D2, D3) long (D0 0, D1 1, D2 2, D3 3));
broadcast!(short (D1, D2, D3) long (D0 0, D1 1, D2 2, D3 3));

/// A shape with axis `Ax`: reducing over it gives `Reduced` (the axis
/// removed), replacing its dim gives `WithDim<N>`. What `sum`, `mean`,
/// `argmax`, `softmax`, `select`, `narrow` and friends ask of their axis.
#[diagnostic::on_unimplemented(
    message = "a tensor of shape `{Self}` has no axis `{Ax}`",
    label = "axes count from 0 and must be below the rank"
)]
pub trait HasAxis<Ax>: Shape {
    /// The shape without the axis.
    type Reduced: Shape;
    /// The shape with the axis' dim replaced by `N`.
    type WithDim<N: Dim>: Shape;
    /// The axis' index.
    const INDEX: usize;
    /// The shape without the axis.
    fn reduced(&self) -> Self::Reduced;
    /// The shape with the axis' dim replaced by `n`.
    fn with_dim<N: Dim>(&self, n: N) -> Self::WithDim<N>;
}

#[diagnostic::do_not_recommend]
impl<D0: Dim> HasAxis<Axis<0>> for (D0,) {
    type Reduced = ();
    type WithDim<N: Dim> = (N,);
    const INDEX: usize = 0;
    fn reduced(&self) -> Self::Reduced {}
    fn with_dim<N: Dim>(&self, n: N) -> Self::WithDim<N> {
        (n,)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim> HasAxis<Axis<0>> for (D0, D1) {
    type Reduced = (D1,);
    type WithDim<N: Dim> = (N, D1);
    const INDEX: usize = 0;
    fn reduced(&self) -> Self::Reduced {
        (self.1,)
    }
    fn with_dim<N: Dim>(&self, n: N) -> Self::WithDim<N> {
        (n, self.1)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim> HasAxis<Axis<1>> for (D0, D1) {
    type Reduced = (D0,);
    type WithDim<N: Dim> = (D0, N);
    const INDEX: usize = 1;
    fn reduced(&self) -> Self::Reduced {
        (self.0,)
    }
    fn with_dim<N: Dim>(&self, n: N) -> Self::WithDim<N> {
        (self.0, n)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim> HasAxis<Axis<0>> for (D0, D1, D2) {
    type Reduced = (D1, D2);
    type WithDim<N: Dim> = (N, D1, D2);
    const INDEX: usize = 0;
    fn reduced(&self) -> Self::Reduced {
        (self.1, self.2)
    }
    fn with_dim<N: Dim>(&self, n: N) -> Self::WithDim<N> {
        (n, self.1, self.2)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim> HasAxis<Axis<1>> for (D0, D1, D2) {
    type Reduced = (D0, D2);
    type WithDim<N: Dim> = (D0, N, D2);
    const INDEX: usize = 1;
    fn reduced(&self) -> Self::Reduced {
        (self.0, self.2)
    }
    fn with_dim<N: Dim>(&self, n: N) -> Self::WithDim<N> {
        (self.0, n, self.2)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim> HasAxis<Axis<2>> for (D0, D1, D2) {
    type Reduced = (D0, D1);
    type WithDim<N: Dim> = (D0, D1, N);
    const INDEX: usize = 2;
    fn reduced(&self) -> Self::Reduced {
        (self.0, self.1)
    }
    fn with_dim<N: Dim>(&self, n: N) -> Self::WithDim<N> {
        (self.0, self.1, n)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> HasAxis<Axis<0>> for (D0, D1, D2, D3) {
    type Reduced = (D1, D2, D3);
    type WithDim<N: Dim> = (N, D1, D2, D3);
    const INDEX: usize = 0;
    fn reduced(&self) -> Self::Reduced {
        (self.1, self.2, self.3)
    }
    fn with_dim<N: Dim>(&self, n: N) -> Self::WithDim<N> {
        (n, self.1, self.2, self.3)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> HasAxis<Axis<1>> for (D0, D1, D2, D3) {
    type Reduced = (D0, D2, D3);
    type WithDim<N: Dim> = (D0, N, D2, D3);
    const INDEX: usize = 1;
    fn reduced(&self) -> Self::Reduced {
        (self.0, self.2, self.3)
    }
    fn with_dim<N: Dim>(&self, n: N) -> Self::WithDim<N> {
        (self.0, n, self.2, self.3)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> HasAxis<Axis<2>> for (D0, D1, D2, D3) {
    type Reduced = (D0, D1, D3);
    type WithDim<N: Dim> = (D0, D1, N, D3);
    const INDEX: usize = 2;
    fn reduced(&self) -> Self::Reduced {
        (self.0, self.1, self.3)
    }
    fn with_dim<N: Dim>(&self, n: N) -> Self::WithDim<N> {
        (self.0, self.1, n, self.3)
    }
}
#[diagnostic::do_not_recommend]
impl<D0: Dim, D1: Dim, D2: Dim, D3: Dim> HasAxis<Axis<3>> for (D0, D1, D2, D3) {
    type Reduced = (D0, D1, D2);
    type WithDim<N: Dim> = (D0, D1, D2, N);
    const INDEX: usize = 3;
    fn reduced(&self) -> Self::Reduced {
        (self.0, self.1, self.2)
    }
    fn with_dim<N: Dim>(&self, n: N) -> Self::WithDim<N> {
        (self.0, self.1, self.2, n)
    }
}
