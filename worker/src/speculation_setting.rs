//! The worker's speculative-decoding settings (`speculation`, `draft_model`,
//! `num_speculative_tokens`, `ngram_min`, `ngram_max`) and their translation into the engine's
//! [`SpeculationConfig`].

use std::path::Path;

use engine::speculation::{Proposer, SpeculationConfig, SpeculationConfigError};
use serde::{Deserialize, Serialize};

/// The `speculation` setting: which proposer drafts tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpeculationSetting {
    /// No speculation (the default until the benchmarks meet issue 28's targets).
    #[default]
    Off,
    /// n-gram prompt lookup.
    Ngram,
    /// A draft model (`draft_model`) proposes greedily.
    Draft,
}

/// Speculation settings the worker cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SpeculationSettingError {
    /// `speculation = draft` without `draft_model`.
    #[error(
        "speculation = draft needs draft_model (--draft-model PATH, WORKER_DRAFT_MODEL): a GGUF \
         file or Hugging Face folder with the model's vocabulary"
    )]
    DraftWithoutModel,
    /// `draft_model` set while `speculation` is not `draft`.
    #[error(
        "draft_model is set but speculation = {0}: set speculation = draft to use it, or unset \
         draft_model"
    )]
    DraftModelUnused(&'static str),
    /// A number out of range.
    #[error(transparent)]
    Numbers(#[from] SpeculationConfigError),
}

/// The engine's speculation settings from the worker's.
///
/// Errors: [`SpeculationSettingError`] naming the setting (`speculation = draft` without a
/// `draft_model`, a `draft_model` that another setting leaves unused, a `num_speculative_tokens`
/// of 0 or above the cap, a bad n-gram range).
pub fn speculation_config(
    setting: SpeculationSetting,
    draft_model: Option<&Path>,
    num_speculative_tokens: usize,
    ngram_min: usize,
    ngram_max: usize,
) -> Result<SpeculationConfig, SpeculationSettingError> {
    let draft_model = draft_model.filter(|p| !p.as_os_str().is_empty());
    let proposer = match setting {
        SpeculationSetting::Off => Proposer::Off,
        SpeculationSetting::Ngram => Proposer::Ngram,
        SpeculationSetting::Draft => Proposer::Draft,
    };
    match (proposer, draft_model) {
        (Proposer::Draft, None) => return Err(SpeculationSettingError::DraftWithoutModel),
        (other, Some(_)) if other != Proposer::Draft => {
            return Err(SpeculationSettingError::DraftModelUnused(other.name()))
        }
        _ => {}
    }
    let config = SpeculationConfig {
        proposer,
        num_speculative_tokens,
        ngram_min,
        ngram_max,
    };
    config.validate()?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Cli, WorkerSettings};
    use clap::Parser;
    use std::path::Path;

    /// Defaults, file, environment and flags; `draft` and an unknown proposer fail naming the
    /// setting.
    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure signature
    fn speculation_settings_load_from_every_source() {
        figment::Jail::expect_with(|jail| {
            let cli = Cli::parse_from(["worker", "--config", "w.toml"]);
            jail.create_file("w.toml", "model = 'a.gguf'\n")?;
            let s = WorkerSettings::load(&cli).map_err(|e| e.to_string())?;
            assert_eq!(s.speculation, SpeculationSetting::Off);
            assert_eq!(
                (s.num_speculative_tokens, s.ngram_min, s.ngram_max),
                (5, 1, 3)
            );
            jail.create_file(
                "w.toml",
                "model = 'a.gguf'\nspeculation = 'ngram'\nnum_speculative_tokens = 7\n",
            )?;
            let s = WorkerSettings::load(&cli).map_err(|e| e.to_string())?;
            assert_eq!(s.speculation, SpeculationSetting::Ngram);
            assert_eq!(s.speculation_config().unwrap().num_speculative_tokens, 7);
            jail.set_env("WORKER_NGRAM_MAX", "4");
            let flagged = Cli::parse_from(["worker", "--config", "w.toml", "--ngram-min", "2"]);
            let s = WorkerSettings::load(&flagged).map_err(|e| e.to_string())?;
            assert_eq!((s.ngram_min, s.ngram_max), (2, 4));
            assert!(s.validate().is_ok());
            let flagged =
                Cli::parse_from(["worker", "--config", "w.toml", "--speculation", "draft"]);
            let s = WorkerSettings::load(&flagged).map_err(|e| e.to_string())?;
            let err = s.validate().unwrap_err().to_string();
            assert!(
                err.starts_with("speculation = draft needs draft_model"),
                "{err}"
            );
            jail.set_env("WORKER_DRAFT_MODEL", "small.gguf");
            let s = WorkerSettings::load(&flagged).map_err(|e| e.to_string())?;
            assert_eq!(s.draft_model.as_deref(), Some(Path::new("small.gguf")));
            assert_eq!(s.speculation_config().unwrap().proposer, Proposer::Draft);
            // The file's `ngram` with a draft model set: refused, naming both settings.
            let err = WorkerSettings::load(&cli)
                .map_err(|e| e.to_string())?
                .validate()
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("draft_model is set but speculation = ngram"),
                "{err}"
            );
            jail.set_env("WORKER_DRAFT_MODEL", "");
            let flagged = Cli::parse_from([
                "worker",
                "--config",
                "w.toml",
                "--num-speculative-tokens",
                "0",
            ]);
            let s = WorkerSettings::load(&flagged).map_err(|e| e.to_string())?;
            let err = s.validate().unwrap_err().to_string();
            assert!(
                err.starts_with("num_speculative_tokens must be in 1..=16"),
                "{err}"
            );
            jail.set_env("WORKER_SPECULATION", "eagle");
            let err = WorkerSettings::load(&cli).unwrap_err().to_string();
            assert!(
                err.contains("eagle") && err.to_lowercase().contains("speculation"),
                "{err}"
            );
            Ok(())
        });
    }

    #[test]
    fn settings_translate_or_name_the_setting() {
        let small = Some(Path::new("small.gguf"));
        let ok = speculation_config(SpeculationSetting::Ngram, None, 5, 1, 3).unwrap();
        assert_eq!(ok.proposer, Proposer::Ngram);
        assert_eq!(
            speculation_config(SpeculationSetting::Off, None, 5, 1, 3)
                .unwrap()
                .proposer,
            Proposer::Off
        );
        let draft = speculation_config(SpeculationSetting::Draft, small, 5, 1, 3).unwrap();
        assert_eq!(draft.proposer, Proposer::Draft);
        let no_model = speculation_config(SpeculationSetting::Draft, None, 5, 1, 3).unwrap_err();
        assert!(
            no_model
                .to_string()
                .starts_with("speculation = draft needs draft_model"),
            "{no_model}"
        );
        let unused = speculation_config(SpeculationSetting::Off, small, 5, 1, 3).unwrap_err();
        assert!(
            unused
                .to_string()
                .starts_with("draft_model is set but speculation = off"),
            "{unused}"
        );
        let zero = speculation_config(SpeculationSetting::Ngram, None, 0, 1, 3).unwrap_err();
        assert!(
            zero.to_string().contains("num_speculative_tokens"),
            "{zero}"
        );
        let big = speculation_config(SpeculationSetting::Off, None, 99, 1, 3).unwrap_err();
        assert!(big.to_string().contains("got 99"), "{big}");
    }
}
