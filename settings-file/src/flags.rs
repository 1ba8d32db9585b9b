//! The command line of a binary whose flags override settings: `--help` shows each flag's default,
//! read from the settings' own defaults, so the help never drifts from what the binary does.

use clap::{Command, Parser};
use serde::Serialize;
use serde_json::Value;

/// Parses the process's arguments into `C`, with `--help` showing `[default: V]` after every flag
/// that is a top-level setting with a default in `defaults` (see [`with_defaults_in_help`]).
/// Exits as clap does on `--help`, `--version` or a bad flag (status 2 for a bad flag).
pub fn parse_flags<C: Parser, S: Serialize>(defaults: &S) -> C {
    let mut matches = with_defaults_in_help(C::command(), defaults).get_matches();
    C::from_arg_matches_mut(&mut matches).unwrap_or_else(|e| e.exit())
}

/// Appends `[default: V]` to the help of every argument of `cmd` whose id (the flag's field name,
/// e.g. `metrics_listen`) is a top-level key of `defaults` serialized: strings as they are (`""`
/// when empty, as an empty list), numbers and booleans as written, lists joined by commas. Tables (`limits`) and
/// settings without a default (`None`) are left alone.
pub fn with_defaults_in_help<S: Serialize>(cmd: Command, defaults: &S) -> Command {
    let Ok(Value::Object(defaults)) = serde_json::to_value(defaults) else {
        return cmd;
    };
    let ids: Vec<String> = cmd
        .get_arguments()
        .map(|a| a.get_id().as_str().to_string())
        .collect();
    ids.into_iter().fold(cmd, |cmd, id| {
        let Some(shown) = defaults.get(&id).and_then(shown_default) else {
            return cmd;
        };
        cmd.mut_arg(&id, |arg| {
            let suffix = format!(" [default: {shown}]");
            let help = arg.get_help().map(|h| format!("{h}{suffix}"));
            let long = arg
                .get_long_help()
                .map(|h| format!("{h}\n\n[default: {shown}]"));
            let arg = match help {
                Some(h) => arg.help(h),
                None => arg.help(suffix.trim_start().to_string()),
            };
            match long {
                Some(h) => arg.long_help(h),
                None => arg,
            }
        })
    })
}

/// How a default value reads in `--help`, or `None` for one not shown (no default, a table).
fn shown_default(v: &Value) -> Option<String> {
    match v {
        Value::String(s) if s.is_empty() => Some("\"\"".to_string()),
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Array(items) if items.is_empty() => Some("\"\"".to_string()),
        Value::Array(items) => {
            let items: Option<Vec<String>> = items.iter().map(shown_default).collect();
            items.map(|i| i.join(","))
        }
        Value::Null | Value::Object(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[derive(Debug, Parser)]
    #[command(name = "demo")]
    struct Cli {
        /// Address to listen on.
        #[arg(long)]
        listen: Option<String>,
        /// Worker threads.
        #[arg(long)]
        threads: Option<u32>,
        /// Metrics address; empty = off.
        #[arg(long)]
        metrics_listen: Option<String>,
        /// A flag with no setting behind it.
        #[arg(long)]
        check_config: bool,
        /// Not in the defaults (None).
        #[arg(long)]
        otlp: Option<String>,
    }

    #[derive(Serialize)]
    struct Settings {
        listen: String,
        threads: u32,
        metrics_listen: String,
        otlp: Option<String>,
        limits: Limits,
        hosts: Vec<String>,
    }

    #[derive(Serialize)]
    struct Limits {
        max: u32,
    }

    fn help() -> String {
        let defaults = Settings {
            listen: "127.0.0.1:50051".into(),
            threads: 4,
            metrics_listen: String::new(),
            otlp: None,
            limits: Limits { max: 1 },
            hosts: vec!["a".into(), "b".into()],
        };
        with_defaults_in_help(Cli::command(), &defaults)
            .render_help()
            .to_string()
    }

    #[test]
    fn help_shows_each_settings_default() {
        let h = help();
        assert!(
            h.contains("Address to listen on [default: 127.0.0.1:50051]"),
            "{h}"
        );
        assert!(h.contains("Worker threads [default: 4]"), "{h}");
        assert!(h.contains("empty = off [default: \"\"]"), "{h}");
        // No setting behind it, or no default: nothing added.
        assert_eq!(h.matches("[default:").count(), 3, "{h}");
    }

    #[test]
    fn lists_are_joined_and_tables_are_skipped() {
        assert_eq!(
            shown_default(&serde_json::json!(["a", "b"])).as_deref(),
            Some("a,b")
        );
        assert_eq!(
            shown_default(&serde_json::json!([])).as_deref(),
            Some("\"\"")
        );
        assert_eq!(shown_default(&serde_json::json!({"max": 1})), None);
        assert_eq!(shown_default(&Value::Null), None);
    }
}
