//! Which served model a request gets, by the name in its `model` field (gRPC
//! `GenerateRequest.model`, the OpenAI body's `model`), and the names each model is listed under.
//!
//! Every worker announces the model it serves under an id (`Info.served_model_name`); the router
//! serves each id its workers announce. The router's own settings name its *default model*, the one
//! a request without `model` gets:
//!
//! - `default_model`: its id; empty = the only model served (with several and no default, a request
//!   without `model` is refused, [`ModelChoiceError::Unnamed`]);
//! - `served_model_name`: the public name it is listed and reported under instead of its id;
//! - `model_aliases`: more names for it.
//!
//! A request may name any served id, or one of the default model's names; any other name is
//! [`ModelChoiceError::Unknown`] (gRPC `NOT_FOUND`, HTTP 404 `model_not_found`), listing the names
//! that are served.

/// Why no served model answers to a request's `model`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelChoiceError {
    /// No served model has the name `requested`.
    #[error(
        "the model `{requested}` does not exist; this router serves {}",
        quoted(served)
    )]
    Unknown {
        /// The name the request gave (or the `default_model` setting, when no worker serves it).
        requested: String,
        /// The names that are served (as `/v1/models` lists them).
        served: Vec<String>,
    },
    /// The request names no model, and the router serves several without a default.
    #[error(
        "the request names no model and this router serves several ({}); set `model` to one of them",
        quoted(served)
    )]
    Unnamed {
        /// The names that are served.
        served: Vec<String>,
    },
}

/// `names` as `` `a`, `b` `` (or "no model yet" when empty).
fn quoted(names: &[String]) -> String {
    if names.is_empty() {
        return "no model yet".into();
    }
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The router's names for its default model (settings `default_model`, `served_model_name`,
/// `model_aliases`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelNaming {
    /// The id of the model requests without `model` get; empty = the only model served.
    pub default_model: String,
    /// The default model's public name (listed and reported instead of its id); empty = its id.
    pub served_model_name: String,
    /// More names of the default model.
    pub aliases: Vec<String>,
}

impl ModelNaming {
    /// The default model among `served` (the served ids): `default_model` when it is served, the
    /// only id when `default_model` is empty and one model is served, `None` otherwise.
    pub fn default_of<'a>(&self, served: &[&'a str]) -> Option<&'a str> {
        if self.default_model.is_empty() {
            return match served {
                [only] => Some(only),
                _ => None,
            };
        }
        served.iter().copied().find(|id| *id == self.default_model)
    }

    /// The name model `id` is listed and reported under.
    pub fn public_name(&self, id: &str, served: &[&str]) -> String {
        if !self.served_model_name.is_empty() && self.default_of(served) == Some(id) {
            self.served_model_name.clone()
        } else {
            id.to_string()
        }
    }

    /// Every name `/v1/models` lists, in the order of `served`: each model's public name, the
    /// default model's aliases after it.
    pub fn listed(&self, served: &[&str]) -> Vec<String> {
        let default = self.default_of(served);
        let mut names = Vec::new();
        for id in served {
            names.push(self.public_name(id, served));
            if default == Some(*id) {
                names.extend(self.aliases.iter().cloned());
            }
        }
        names
    }

    /// The served id a request naming `requested` gets (`None` or empty: the default model).
    ///
    /// Errors: [`ModelChoiceError::Unknown`] for a name that is neither a served id nor one of the
    /// default model's names (or a `default_model` no worker serves);
    /// [`ModelChoiceError::Unnamed`] without a name when several models and no default are served.
    pub fn choose<'a>(
        &self,
        requested: Option<&str>,
        served: &[&'a str],
    ) -> Result<&'a str, ModelChoiceError> {
        let default = self.default_of(served);
        match requested.filter(|name| !name.is_empty()) {
            None => default.ok_or_else(|| {
                if self.default_model.is_empty() {
                    ModelChoiceError::Unnamed {
                        served: self.listed(served),
                    }
                } else {
                    ModelChoiceError::Unknown {
                        requested: self.default_model.clone(),
                        served: self.listed(served),
                    }
                }
            }),
            Some(name) => {
                if let Some(id) = served.iter().copied().find(|id| *id == name) {
                    return Ok(id);
                }
                let names_default =
                    name == self.served_model_name || self.aliases.iter().any(|a| a == name);
                match default {
                    Some(id) if names_default => Ok(id),
                    _ => Err(ModelChoiceError::Unknown {
                        requested: name.to_string(),
                        served: self.listed(served),
                    }),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naming(default_model: &str, served_model_name: &str, aliases: &[&str]) -> ModelNaming {
        ModelNaming {
            default_model: default_model.into(),
            served_model_name: served_model_name.into(),
            aliases: aliases.iter().map(|a| a.to_string()).collect(),
        }
    }

    #[test]
    fn one_model_is_the_default_under_every_name() {
        let n = naming("", "public", &["alias"]);
        let served = ["tiny"];
        for name in [None, Some(""), Some("tiny"), Some("public"), Some("alias")] {
            assert_eq!(n.choose(name, &served), Ok("tiny"), "{name:?}");
        }
        assert_eq!(n.listed(&served), ["public", "alias"]);
        assert_eq!(
            n.choose(Some("gpt-4o"), &served),
            Err(ModelChoiceError::Unknown {
                requested: "gpt-4o".into(),
                served: vec!["public".into(), "alias".into()]
            })
        );
    }

    #[test]
    fn several_models_need_a_name_unless_one_is_the_default() {
        let served = ["a", "b"];
        let n = naming("", "", &["x"]);
        assert_eq!(n.choose(Some("b"), &served), Ok("b"));
        let unnamed = n.choose(None, &served).unwrap_err();
        assert_eq!(
            unnamed,
            ModelChoiceError::Unnamed {
                served: vec!["a".into(), "b".into()]
            }
        );
        assert!(unnamed.to_string().contains("`a`, `b`"), "{unnamed}");
        // Aliases name the default model: without one they name nothing.
        assert!(matches!(
            n.choose(Some("x"), &served),
            Err(ModelChoiceError::Unknown { .. })
        ));
        let n = naming("b", "public-b", &["x"]);
        assert_eq!(n.choose(None, &served), Ok("b"));
        assert_eq!(n.choose(Some("x"), &served), Ok("b"));
        assert_eq!(n.choose(Some("public-b"), &served), Ok("b"));
        assert_eq!(n.choose(Some("a"), &served), Ok("a"));
        assert_eq!(n.listed(&served), ["a", "public-b", "x"]);
    }

    #[test]
    fn a_default_no_worker_serves_is_unknown() {
        let n = naming("c", "", &[]);
        let e = n.choose(None, &["a", "b"]).unwrap_err();
        assert_eq!(
            e,
            ModelChoiceError::Unknown {
                requested: "c".into(),
                served: vec!["a".into(), "b".into()]
            }
        );
        assert_eq!(
            e.to_string(),
            "the model `c` does not exist; this router serves `a`, `b`"
        );
    }
}
