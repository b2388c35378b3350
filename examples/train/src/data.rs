//! The digits data set: parsing `digits.csv` and the fixed train/test split.

use std::path::Path;

use crate::error::{Result, TrainError};

/// Pixels per image (8x8).
pub const FEATURES: usize = 64;
/// Number of classes (digits 0..9).
pub const CLASSES: usize = 10;
/// Largest pixel value in the file; pixels are scaled by its inverse into `[0, 1]`.
pub const PIXEL_MAX: u8 = 16;

/// A set of labelled samples, features already scaled to `[0, 1]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Dataset {
    features: Vec<f32>,
    labels: Vec<u8>,
}

impl Dataset {
    /// Reads `label,p0,..,p63` lines (`#` lines and blank lines are skipped).
    pub fn load(path: &Path) -> Result<Dataset> {
        let text = std::fs::read_to_string(path).map_err(|source| TrainError::Io {
            context: "reading data file",
            path: path.to_path_buf(),
            source,
        })?;
        Dataset::parse(&text, path)
    }

    /// Parses the text of a data file; `path` only names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Dataset> {
        let mut data = Dataset::default();
        for (index, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |message: String| TrainError::Data {
                path: path.to_path_buf(),
                line: index + 1,
                message,
            };
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            if fields.len() != FEATURES + 1 {
                return Err(bad(format!(
                    "expected {} comma-separated fields (label and {FEATURES} pixels), found {}",
                    FEATURES + 1,
                    fields.len()
                )));
            }
            let label: u8 = fields[0]
                .parse()
                .ok()
                .filter(|l| usize::from(*l) < CLASSES)
                .ok_or_else(|| bad(format!("label {:?} is not a digit 0..9", fields[0])))?;
            data.labels.push(label);
            for (column, field) in fields[1..].iter().enumerate() {
                let pixel: u8 =
                    field
                        .parse()
                        .ok()
                        .filter(|p| *p <= PIXEL_MAX)
                        .ok_or_else(|| {
                            bad(format!(
                                "pixel {column} is {field:?}, not an integer 0..{PIXEL_MAX}"
                            ))
                        })?;
                data.features
                    .push(f32::from(pixel) * (1.0 / f32::from(PIXEL_MAX)));
            }
        }
        Ok(data)
    }

    /// Builds a data set from scaled features (`FEATURES` per sample) and labels.
    pub fn from_parts(features: Vec<f32>, labels: Vec<u8>) -> Result<Dataset> {
        if features.len() != labels.len() * FEATURES {
            return Err(TrainError::Config(format!(
                "{} feature values do not make {} samples of {FEATURES}",
                features.len(),
                labels.len()
            )));
        }
        if let Some(bad) = labels.iter().find(|l| usize::from(**l) >= CLASSES) {
            return Err(TrainError::Config(format!(
                "label {bad} is not a digit 0..9"
            )));
        }
        Ok(Dataset { features, labels })
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there is no sample.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The scaled pixels of sample `i`.
    pub fn features(&self, i: usize) -> &[f32] {
        &self.features[i * FEATURES..(i + 1) * FEATURES]
    }

    /// The label of sample `i`.
    pub fn label(&self, i: usize) -> usize {
        usize::from(self.labels[i])
    }

    /// The fixed split: the first `train` samples train, the rest test (the file's order is
    /// already mixed: scikit-learn's copy cycles through the digits).
    pub fn split(&self, train: usize) -> Result<(Dataset, Dataset)> {
        if train == 0 || train >= self.len() {
            return Err(TrainError::Config(format!(
                "cannot split {} samples into {train} for training and the rest for testing",
                self.len()
            )));
        }
        let (train_x, test_x) = self.features.split_at(train * FEATURES);
        let (train_y, test_y) = self.labels.split_at(train);
        Ok((
            Dataset {
                features: train_x.to_vec(),
                labels: train_y.to_vec(),
            },
            Dataset {
                features: test_x.to_vec(),
                labels: test_y.to_vec(),
            },
        ))
    }

    /// A checksum of the contents, so that ranks and checkpoints can confirm they train on
    /// the same data.
    pub fn fingerprint(&self) -> u32 {
        let mut hasher = crc32fast::Hasher::new();
        for x in &self.features {
            hasher.update(&x.to_le_bytes());
        }
        hasher.update(&self.labels);
        hasher.finalize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(label: u8, pixel: u8) -> String {
        let mut fields = vec![label.to_string()];
        fields.extend((0..FEATURES).map(|_| pixel.to_string()));
        fields.join(",")
    }

    #[test]
    fn parses_samples_skipping_comments_and_scales_pixels() {
        let text = format!("# header\n{}\n\n{}\n", line(3, 16), line(9, 4));
        let data = Dataset::parse(&text, Path::new("d.csv")).unwrap();
        assert_eq!(data.len(), 2);
        assert_eq!(data.label(0), 3);
        assert_eq!(data.label(1), 9);
        assert!(data.features(0).iter().all(|x| *x == 1.0));
        assert!(data.features(1).iter().all(|x| *x == 0.25));
    }

    #[test]
    fn rejects_bad_lines_naming_file_and_line() {
        let cases = [
            (format!("{}\n1,2,3\n", line(1, 1)), "d.csv:2: expected 65"),
            (line(10, 1), "d.csv:1: label \"10\""),
            (line(1, 17), "d.csv:1: pixel 0 is \"17\""),
        ];
        for (text, want) in cases {
            let err = Dataset::parse(&text, Path::new("d.csv"))
                .unwrap_err()
                .to_string();
            assert!(err.starts_with(want), "{err} should start with {want}");
        }
    }

    #[test]
    fn split_keeps_order_and_rejects_empty_halves() {
        let text: Vec<String> = (0..5).map(|i| line(i, i)).collect();
        let data = Dataset::parse(&text.join("\n"), Path::new("d.csv")).unwrap();
        let (train, test) = data.split(3).unwrap();
        assert_eq!((train.len(), test.len()), (3, 2));
        assert_eq!(test.label(0), 3);
        assert_eq!(test.features(1), data.features(4));
        assert!(data.split(5).is_err());
        assert!(data.split(0).is_err());
    }

    #[test]
    fn the_shipped_file_has_1797_samples_of_every_class() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/digits.csv");
        let data = Dataset::load(&path).unwrap();
        assert_eq!(data.len(), 1797);
        let mut counts = [0usize; CLASSES];
        for i in 0..data.len() {
            counts[data.label(i)] += 1;
        }
        assert!(counts.iter().all(|c| (170..=190).contains(c)), "{counts:?}");
    }
}
