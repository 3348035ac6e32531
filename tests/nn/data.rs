//! The data adaptors on plain iterators and on a `Dataset`, the seeded
//! shuffle against SplitMix64 and Fisher–Yates written here, and the CSV
//! reader on plain and gzip files (the shipped digits data included).

use crate::host;
use kiln::data::{read_csv, stack, Dataset, IteratorExt, Rng};
use kiln::prelude::*;
use std::io::Write;

/// SplitMix64 and a Fisher–Yates shuffle from the back, as published.
fn reference_permutation(seed: u64, n: usize) -> Vec<usize> {
    let mut s = seed;
    let mut next = || {
        s = s.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    };
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = ((next() as u128 * (i as u128 + 1)) >> 64) as usize;
        p.swap(i, j);
    }
    p
}

#[test]
fn shuffled_is_the_reference_fisher_yates_and_continues_the_stream() {
    let mut rng = Rng::new(9);
    let first: Vec<usize> = (0..50).shuffled(&mut rng).collect();
    assert_eq!(first, reference_permutation(9, 50));
    // A second epoch draws on: another order, still a permutation.
    let second: Vec<usize> = (0..50).shuffled(&mut rng).collect();
    assert_ne!(first, second);
    let mut sorted = second.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..50).collect::<Vec<_>>());
    assert_eq!(Rng::new(9).permutation(50), first);
}

#[test]
fn batch_collate_and_stack_on_plain_iterators() -> Result<()> {
    let groups: Vec<Vec<i32>> = (0..10).batch(4).collect();
    assert_eq!(groups, [vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
    let exact: Vec<Vec<i32>> = (0..10).batch_exact(4).collect();
    assert_eq!(exact, [vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    assert_eq!((0..3).batch(0).count(), 3, "a size of 0 is taken as 1");
    let pairs = (0..5).map(|i| (vec![i as f32, -(i as f32)], i as i64 * 10));
    let collated: Vec<(Vec<Vec<f32>>, Vec<i64>)> = pairs.clone().batch(3).collate().collect();
    assert_eq!(collated[1], (vec![vec![3.0, -3.0], vec![4.0, -4.0]], vec![30, 40]));
    let ctx = Context::cpu();
    let tensors: Vec<(Tensor, Tensor)> = pairs.batch(3).collate().stack(&ctx).collect::<Result<_>>()?;
    assert_eq!(tensors[0].0.shape(), &[3, 2]);
    assert_eq!(host(&tensors[0].0), [0.0, -0.0, 1.0, -1.0, 2.0, -2.0]);
    assert_eq!((tensors[1].1.dtype(), tensors[1].1.to_vec::<i64>()?), (DType::I64, vec![30, 40]));
    let single = stack(&ctx, vec![1.5f64, 2.5])?;
    assert_eq!((single.shape(), single.to_vec::<f64>()?), (&[2usize][..], vec![1.5, 2.5]));
    Ok(())
}

#[test]
fn dataset_iterates_splits_and_subsets() -> Result<()> {
    let features: Vec<f32> = (0..30).map(|v| v as f32).collect();
    let labels: Vec<i64> = (0..10).map(|i| i % 3).collect();
    let data = Dataset::new(features, &[3], labels.clone())?;
    assert_eq!((data.len(), data.is_empty(), data.sample_shape()), (10, false, &[3usize][..]));
    assert_eq!(data.get(4), Some((&[12.0f32, 13.0, 14.0][..], 1)));
    assert_eq!(data.get(10), None);
    let (train, test) = data.split(0.8, &mut Rng::new(5))?;
    assert_eq!((train.len(), test.len()), (8, 2));
    // The split is the permutation of the seed, cut at round(0.8 · 10).
    let order = reference_permutation(5, 10);
    assert_eq!(train, data.subset(&order[..8]));
    assert_eq!(test.labels(), order[8..].iter().map(|&i| labels[i]).collect::<Vec<_>>());
    let scaled = data.clone().map_features(|v| v / 2.0);
    assert_eq!(scaled.get(1).unwrap().0, &[1.5, 2.0, 2.5]);
    // Through the adaptors: every sample exactly once per epoch.
    let ctx = Context::cpu();
    let mut seen = Vec::new();
    for batch in data.iter().shuffled(&mut Rng::new(1)).batch(4).collate().stack(&ctx) {
        let (x, y) = batch?;
        let rows = host(&x);
        for (row, label) in rows.chunks(3).zip(y.to_vec::<i64>()?) {
            assert_eq!(label, (row[0] as i64 / 3) % 3, "features and label stay together");
            seen.push(row[0] as usize / 3);
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
    Ok(())
}

fn tmp(name: &str) -> std::path::PathBuf {
    crate::scratch_dir().join(format!("data-{name}-{}", std::process::id()))
}

#[test]
fn csv_reads_plain_and_gzip_files() -> Result<()> {
    let text = "1,2,0\n0.5, -3 ,1\n\n4e2,5,2\n";
    let plain = tmp("plain.csv");
    std::fs::write(&plain, text).map_err(|e| Error::Io(e.to_string()))?;
    let gz = tmp("table.csv.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(text.as_bytes()).map_err(|e| Error::Io(e.to_string()))?;
    std::fs::write(&gz, enc.finish().map_err(|e| Error::Io(e.to_string()))?)
        .map_err(|e| Error::Io(e.to_string()))?;
    for path in [&plain, &gz] {
        let t = read_csv(path)?;
        assert_eq!((t.rows, t.cols), (3, 3));
        assert_eq!(t.values, [1.0, 2.0, 0.0, 0.5, -3.0, 1.0, 400.0, 5.0, 2.0]);
        let d = Dataset::from_csv(path, &[2])?;
        assert_eq!((d.len(), d.labels()), (3, &[0i64, 1, 2][..]));
    }
    let _ = std::fs::remove_file(plain);
    let _ = std::fs::remove_file(gz);
    Ok(())
}

#[test]
fn the_shipped_digits_data() -> Result<()> {
    let d = Dataset::from_csv("examples/data/digits.csv.gz", &[64])?;
    assert_eq!(d.len(), 1797);
    let mut counts = [0usize; 10];
    for (x, y) in d.iter() {
        assert!(x.iter().all(|v| (0.0..=16.0).contains(v) && v.fract() == 0.0));
        counts[y as usize] += 1;
    }
    // UCI's test set of the optical digits: 174-183 images per class.
    assert!(counts.iter().all(|&c| (170..=185).contains(&c)), "{counts:?}");
    Ok(())
}
