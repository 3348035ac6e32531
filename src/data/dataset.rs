//! A small in-memory dataset: samples of one shape (f32) and class labels.

use super::{read_csv, Rng};
use crate::{Error, Location, Result};
use std::path::Path;

/// `n` samples, each `sample_shape` f32 values (row-major), with an i64
/// label each: what fits in memory and feeds a classifier.
/// [`Dataset::iter`] yields `(&[f32], i64)` pairs for the adaptors of
/// [`super::IteratorExt`].
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    features: Vec<f32>,
    sample_shape: Vec<usize>,
    labels: Vec<i64>,
}

impl Dataset {
    /// A dataset of `labels.len()` samples of shape `sample_shape`;
    /// `features` must hold exactly that many values.
    #[track_caller]
    pub fn new(features: Vec<f32>, sample_shape: &[usize], labels: Vec<i64>) -> Result<Dataset> {
        let per: usize = sample_shape.iter().product();
        if features.len() != per * labels.len() {
            return Err(Error::Shape {
                op: "Dataset::new",
                message: format!(
                    "{} labels of samples {sample_shape:?} need {} feature values, got {}",
                    labels.len(),
                    per * labels.len(),
                    features.len()
                ),
                location: Location::caller(),
            });
        }
        Ok(Dataset { features, sample_shape: sample_shape.to_vec(), labels })
    }

    /// Reads a numeric CSV (plain or gzip, see [`read_csv`]) with one
    /// sample per row: the last column is the label (an integer), the
    /// others are the features, read as samples of `sample_shape`.
    #[track_caller]
    pub fn from_csv(path: impl AsRef<Path>, sample_shape: &[usize]) -> Result<Dataset> {
        let location = Location::caller();
        let path = path.as_ref();
        let csv = read_csv(path)?;
        let per: usize = sample_shape.iter().product();
        if csv.cols != per + 1 {
            return Err(Error::Shape {
                op: "Dataset::from_csv",
                message: format!(
                    "{} has {} columns; samples {sample_shape:?} and a label need {}",
                    path.display(),
                    csv.cols,
                    per + 1
                ),
                location,
            });
        }
        let mut features = Vec::with_capacity(csv.rows * per);
        let mut labels = Vec::with_capacity(csv.rows);
        for i in 0..csv.rows {
            let row = csv.row(i);
            let label = row[per];
            if label.fract() != 0.0 || !label.is_finite() {
                return Err(Error::Io(format!(
                    "{}, row {}: the label {label} is not an integer",
                    path.display(),
                    i + 1
                )));
            }
            features.extend_from_slice(&row[..per]);
            labels.push(label as i64);
        }
        Dataset::new(features, sample_shape, labels)
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True with no samples.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The shape of one sample.
    pub fn sample_shape(&self) -> &[usize] {
        &self.sample_shape
    }

    /// Sample `i`: its features and label.
    pub fn get(&self, i: usize) -> Option<(&[f32], i64)> {
        let per = self.features.len().checked_div(self.labels.len()).unwrap_or(0);
        Some((self.features.get(i * per..(i + 1) * per)?, *self.labels.get(i)?))
    }

    /// Every sample in order, as `(features, label)`.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&[f32], i64)> + '_ {
        let per: usize = self.sample_shape.iter().product();
        (0..self.len()).map(move |i| (&self.features[i * per..(i + 1) * per], self.labels[i]))
    }

    /// The labels.
    pub fn labels(&self) -> &[i64] {
        &self.labels
    }

    /// Applies `f` to every feature value (scaling, centering).
    pub fn map_features(mut self, f: impl Fn(f32) -> f32) -> Dataset {
        self.features.iter_mut().for_each(|v| *v = f(*v));
        self
    }

    /// The samples at `indices`, in that order (an index past the end is
    /// skipped).
    pub fn subset(&self, indices: &[usize]) -> Dataset {
        let mut features = Vec::new();
        let mut labels = Vec::new();
        for &i in indices {
            if let Some((x, y)) = self.get(i) {
                features.extend_from_slice(x);
                labels.push(y);
            }
        }
        Dataset { features, sample_shape: self.sample_shape.clone(), labels }
    }

    /// A random split: the samples in the order of `rng.permutation(len)`,
    /// the first `round(len · fraction)` in the first part, the rest in
    /// the second. The same seed gives the same split.
    #[track_caller]
    pub fn split(&self, fraction: f64, rng: &mut Rng) -> Result<(Dataset, Dataset)> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(Error::Argument {
                op: "Dataset::split",
                message: format!("the fraction must be in [0, 1], got {fraction}"),
                location: Location::caller(),
            });
        }
        let order = rng.permutation(self.len());
        let cut = (self.len() as f64 * fraction).round() as usize;
        Ok((self.subset(&order[..cut]), self.subset(&order[cut..])))
    }
}
