//! Views: values of reshape / permute / transpose / t / narrow / slice with
//! step / squeeze / unsqueeze / flatten / broadcast_to and compositions of
//! them, on every dtype; and that realizing a view copies nothing.

use crate::reference::*;
use kiln::prelude::*;

/// A view on both sides: the kiln op and the same view of the reference.
type ViewCase = (&'static str, fn(&Tensor) -> Tensor, fn(&Nd<i64>) -> Nd<i64>);

fn cases() -> Vec<ViewCase> {
    // Every case starts from shape [2, 3, 4].
    vec![
        ("reshape [6,4]", |t| t.reshape([6, 4]), |a| a.reshape(&[6, 4])),
        ("reshape []->flatten", |t| t.flatten(), |a| a.reshape(&[24])),
        ("permute [2,0,1]", |t| t.permute(&[2, 0, 1]), |a| a.permute(&[2, 0, 1])),
        ("transpose 0 2", |t| t.transpose(0, 2), |a| a.transpose(0, 2)),
        ("t", |t| t.t(), |a| a.transpose(1, 2)),
        ("narrow 2 1 2", |t| t.narrow(2, 1, 2), |a| a.slice(2, 1, 1, 2)),
        ("slice 2 0..4 step 3", |t| t.slice(2, 0, 4, 3), |a| a.slice(2, 0, 3, 2)),
        ("slice 1 1..3 step 1", |t| t.slice(1, 1, 3, 1), |a| a.slice(1, 1, 1, 2)),
        ("slice empty", |t| t.slice(1, 2, 2, 1), |a| a.slice(1, 2, 1, 0)),
        ("unsqueeze 3", |t| t.unsqueeze(3), |a| a.reshape(&[2, 3, 4, 1])),
        ("unsqueeze 0 then squeeze 0", |t| t.unsqueeze(0).squeeze(0), |a| a.clone()),
        (
            "narrow to 1 then squeeze",
            |t| t.narrow(1, 2, 1).squeeze(1),
            |a| a.slice(1, 2, 1, 1).reshape(&[2, 4]),
        ),
        ("broadcast_to [5,2,3,4]", |t| t.broadcast_to([5, 2, 3, 4]), |a| a.expand(&[5, 2, 3, 4])),
        (
            "permute of a slice of an expand",
            |t| t.narrow(0, 1, 1).broadcast_to([3, 3, 4]).slice(2, 1, 4, 2).permute(&[2, 0, 1]),
            |a| a.slice(0, 1, 1, 1).expand(&[3, 3, 4]).slice(2, 1, 2, 2).permute(&[2, 0, 1]),
        ),
        (
            "reshape of a transposed view (needs a copy)",
            |t| t.transpose(0, 2).reshape([4, 6]),
            |a| a.transpose(0, 2).reshape(&[4, 6]),
        ),
        (
            "reshape of a strided slice",
            |t| t.slice(2, 1, 4, 2).reshape([3, 4]),
            |a| a.slice(2, 1, 2, 2).reshape(&[3, 4]),
        ),
        (
            "reshape of an expand, then permute",
            |t| t.narrow(1, 0, 1).broadcast_to([2, 2, 4]).reshape([4, 4]).t(),
            |a| a.slice(1, 0, 1, 1).expand(&[2, 2, 4]).reshape(&[4, 4]).transpose(0, 1),
        ),
        ("view of a view of a view", |t| t.t().t().permute(&[1, 0, 2]).transpose(0, 1), |a| a.clone()),
    ]
}

#[test]
fn views_on_every_dtype() {
    each_backend(|| {
        let ctx = dev();
        let mut rng = Rng::new(50);
        for dtype in DType::ALL {
            let (t, h) = rand_tensor(&ctx, &mut rng, dtype, &[2, 3, 4]);
            // Views are exact, so the reference may run on the indices alone.
            let ids = Nd::from_fn(&[2, 3, 4], |i| (i[0] * 12 + i[1] * 4 + i[2]) as i64);
            let all = match &h {
                Host::F(a) => a.to_vec(),
                Host::I(a) => a.to_vec().into_iter().map(|x| x as f64).collect(),
            };
            for (name, view, reference) in cases() {
                let got = view(&t);
                let picked = reference(&ids);
                let want = match &h {
                    Host::F(_) => Host::F(picked.map(|i| all[i as usize])),
                    Host::I(a) => {
                        let v = a.to_vec();
                        Host::I(picked.map(|i| v[i as usize]))
                    }
                };
                check(&got, dtype, &want, 0.0, name);
                // And the view as an operand of a computation.
                if dtype == DType::F32 {
                    let doubled = &got * 2.0;
                    check(
                        &doubled,
                        dtype,
                        &Host::F(want.f().map(|x| x * 2.0)),
                        1.0,
                        &format!("2 * ({name})"),
                    );
                }
            }
        }
    });
}

#[test]
fn views_of_realized_values_copy_nothing() {
    let ctx = Context::cpu();
    let mut rng = Rng::new(51);
    let a = rand_f(&mut rng, DType::F32, &[4, 6, 8], 1.0);
    let t = tensor_f(&ctx, DType::F32, &a);
    t.realize().unwrap();
    let before = ctx.stats().bytes_allocated;
    let v = t.narrow(0, 1, 2).slice(2, 0, 8, 2).permute(&[2, 0, 1]).unsqueeze(1).broadcast_to([4, 3, 2, 6]);
    v.realize().unwrap();
    let after = ctx.stats().bytes_allocated;
    assert_eq!(after, before, "realizing a chain of views allocated {} bytes", after - before);
    let want = a
        .slice(0, 1, 1, 2)
        .slice(2, 0, 2, 4)
        .permute(&[2, 0, 1])
        .reshape(&[4, 1, 2, 6])
        .expand(&[4, 3, 2, 6]);
    check_f(&v, DType::F32, &want, 0.0, "the view's values");
    // Reading the base again still gives the original data.
    check_f(&t, DType::F32, &a, 0.0, "the base after its view was realized");
}

#[test]
fn realized_views_keep_values_when_used_later() {
    each_backend(|| {
        // A view realized first, then used in later computations with its base.
        let ctx = dev();
        let mut rng = Rng::new(52);
        let a = rand_f(&mut rng, DType::F64, &[5, 7], 1.0);
        let t = tensor_f(&ctx, DType::F64, &a);
        let v = t.t().slice(0, 1, 7, 3); // [2, 5]
        v.realize().unwrap();
        let s = (&v + &t.narrow(1, 0, 2).t()).sum(&[1], false);
        let av = a.transpose(0, 1).slice(0, 1, 3, 2);
        let want = av
            .zip(&a.slice(1, 0, 1, 2).transpose(0, 1), |x, y| x + y)
            .reduce(&[1], false, |v| v.iter().sum());
        check_f(&s, DType::F64, &want, 5.0, "view + view after realize");
    });
}
