//! Misuse of devices and groups: every case an error that says what and
//! where, never a hang or a wrong value.

use super::on_ranks;
use kiln::dist::Group;
use kiln::prelude::*;
use std::time::Duration;

#[test]
fn an_op_across_contexts_names_both() {
    let (a, b) = (Context::cpu(), Context::cpu());
    let err = (a.zeros([2]) + b.zeros([2])).to_vec::<f32>().unwrap_err().to_string();
    assert!(
        err.contains("two different contexts, cpu (context") && err.contains(") and cpu (context"),
        "{err}"
    );
    assert!(err.contains(".to(&ctx)") && err.contains("errors.rs"), "{err}");
    // The explicit copy works.
    let y = a.full([2], 3.0f32).to(&b) + b.ones([2]);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![4.0, 4.0]);
}

#[test]
fn a_collective_outside_a_group_is_a_device_error_at_the_call() {
    let ctx = Context::cpu();
    let err = ctx.zeros([2]).all_reduce_sum().to_vec::<f32>().unwrap_err();
    assert!(matches!(err, Error::Device { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("all_reduce_sum on a context that is in no process group"), "{text}");
    assert!(text.contains("errors.rs"), "{text}");
}

#[test]
fn groups_refuse_a_context_twice_or_a_second_group() {
    let a = Context::cpu();
    let err = Group::new(&[a.clone(), a.clone()]).err().unwrap().to_string();
    assert!(err.contains("contexts 0 and 1 are the same context"), "{err}");
    Group::new(std::slice::from_ref(&a)).unwrap();
    let err = Group::new(&[a.clone(), Context::cpu()]).err().unwrap().to_string();
    assert!(err.contains("is already rank 0 of a group of 1"), "{err}");
    let err = Group::new(&[]).err().unwrap().to_string();
    assert!(err.contains("at least one context"), "{err}");
}

#[test]
fn ranks_running_different_collectives_fail_naming_both() {
    let ctxs = [Context::cpu(), Context::cpu()];
    Group::new(&ctxs).unwrap();
    let errs = on_ranks(&ctxs, |r, ctx| {
        let x = ctx.zeros([2 + r]);
        x.all_reduce_sum().to_vec::<f32>().unwrap_err().to_string()
    });
    assert!(errs.iter().any(|e| e.contains("collective #0 is all_reduce_sum f32[")), "{errs:?}");
}

#[test]
fn a_rank_that_never_comes_times_out_instead_of_hanging() {
    let ctxs = [Context::cpu(), Context::cpu()];
    Group::with_timeout(&ctxs, Duration::from_millis(100)).unwrap();
    let err = ctxs[0].ones([3]).all_reduce_sum().to_vec::<f32>().unwrap_err().to_string();
    assert!(err.contains("rank 0 waited") && err.contains("never ran it"), "{err}");
    // The group is broken from then on, for every rank.
    let err = ctxs[1].ones([3]).all_reduce_sum().to_vec::<f32>().unwrap_err().to_string();
    assert!(err.contains("the process group is broken"), "{err}");
}

#[test]
fn broadcast_from_a_rank_outside_the_group_is_an_error() {
    let ctxs = [Context::cpu(), Context::cpu()];
    Group::new(&ctxs).unwrap();
    let err = ctxs[0].ones([1]).broadcast_from(2).to_vec::<f32>().unwrap_err().to_string();
    assert!(err.contains("broadcast_from rank 2, but the group has 2 rank(s)"), "{err}");
}

#[test]
fn data_parallel_rejects_a_batch_that_does_not_split() {
    use kiln::dist::DataParallel;
    use kiln::nn::{self, Linear, Module};
    use kiln::optim::{Sgd, SgdConfig};
    let ranks = [Context::cpu(), Context::cpu()];
    let mut dp = DataParallel::new(
        &ranks,
        |ctx| {
            let m = Linear::new(ctx, "fc", 2, 1)?;
            let o = Sgd::new(&m, SgdConfig::default())?;
            Ok((m, o))
        },
        |m, b| nn::mse(&m.forward(&b[0])?, &b[1]),
    )
    .unwrap();
    let host = Context::cpu();
    let err = dp.step(&[&host.zeros([3, 2]), &host.zeros([3, 1])]).err().unwrap().to_string();
    assert!(err.contains("3 rows along dim 0, which does not split into 2 equal shards"), "{err}");
}

#[test]
fn devices_lists_the_cpu_first() {
    let d = kiln::dist::devices();
    assert_eq!(d[0].ordinal, None);
    assert_eq!(d[0].description, "cpu");
    for (k, dev) in d[1..].iter().enumerate() {
        assert_eq!(dev.ordinal, Some(k));
        assert!(dev.description.starts_with(&format!("cuda:{k} ")), "{}", dev.description);
    }
}
