//! The worker's speculative-decoding settings (`speculation`, `num_speculative_tokens`,
//! `ngram_min`, `ngram_max`) and their translation into the engine's [`SpeculationConfig`].

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
    /// A draft model: named by issue 28 but not built yet; refused at start-up.
    Draft,
}

/// Speculation settings the worker cannot run.
#[derive(Debug, thiserror::Error)]
pub enum SpeculationSettingError {
    /// `speculation = draft` (not built yet).
    #[error(
        "speculation = draft is not available in this build (draft-model proposals are not \
         implemented yet): use `speculation = ngram` or `off`"
    )]
    DraftNotBuilt,
    /// A number out of range.
    #[error(transparent)]
    Numbers(#[from] SpeculationConfigError),
}

/// The engine's speculation settings from the worker's.
///
/// Errors: [`SpeculationSettingError`] naming the setting (`speculation = draft`, a
/// `num_speculative_tokens` of 0 or above the cap, a bad n-gram range).
pub fn speculation_config(
    setting: SpeculationSetting,
    num_speculative_tokens: usize,
    ngram_min: usize,
    ngram_max: usize,
) -> Result<SpeculationConfig, SpeculationSettingError> {
    let proposer = match setting {
        SpeculationSetting::Off => Proposer::Off,
        SpeculationSetting::Ngram => Proposer::Ngram,
        SpeculationSetting::Draft => return Err(SpeculationSettingError::DraftNotBuilt),
    };
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
                err.starts_with("speculation = draft is not available"),
                "{err}"
            );
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
        let ok = speculation_config(SpeculationSetting::Ngram, 5, 1, 3).unwrap();
        assert_eq!(ok.proposer, Proposer::Ngram);
        assert_eq!(
            speculation_config(SpeculationSetting::Off, 5, 1, 3)
                .unwrap()
                .proposer,
            Proposer::Off
        );
        let draft = speculation_config(SpeculationSetting::Draft, 5, 1, 3).unwrap_err();
        assert!(
            draft.to_string().starts_with("speculation = draft"),
            "{draft}"
        );
        let zero = speculation_config(SpeculationSetting::Ngram, 0, 1, 3).unwrap_err();
        assert!(
            zero.to_string().contains("num_speculative_tokens"),
            "{zero}"
        );
        let big = speculation_config(SpeculationSetting::Off, 99, 1, 3).unwrap_err();
        assert!(big.to_string().contains("got 99"), "{big}");
    }
}
