//! The models a pool serves ([`ModelTable`]): one [`ServedModel`] per id the workers announce
//! (`Info.served_model_name`, or `model_name` from an older worker), each with its tokenizer, chat
//! template and limits ([`ModelContext`]) and its KV block size, and which model each described
//! worker serves. The pool keeps one admission queue per model and routes a model's requests only
//! among its own workers, so each model is a pool of its own under the routing policy.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use inference_proto::worker::InfoResponse;

use crate::model_choice::{ModelChoiceError, ModelNaming};
use crate::model_context::{ChatTemplateFile, ModelContext};

/// One served model.
pub struct ServedModel {
    /// Its id (what requests name).
    pub id: Arc<str>,
    /// Tokenizer, chat template, limits.
    pub context: Arc<ModelContext>,
    /// Tokens per KV block of its workers' hash chains (its first worker's `Info`; 0 when unknown).
    pub block_size: usize,
}

/// The id a worker's `Info` announces its model under: `served_model_name`, or `model_name` from a
/// worker that predates it.
pub fn announced_id(info: &InfoResponse) -> &str {
    if info.served_model_name.is_empty() {
        &info.model_name
    } else {
        &info.served_model_name
    }
}

/// What a described worker serves: its model's id and its numeric mode (`Info.numerics`).
struct Described {
    model: Arc<str>,
    numerics: String,
}

/// The served models and which worker serves which.
#[derive(Default)]
pub struct ModelTable {
    models: BTreeMap<Arc<str>, Arc<ServedModel>>,
    workers: HashMap<String, Described>,
}

/// What a router reports as a model's numeric mode (`ModelInfo.numerics`, `/v1/models`) from its
/// workers' `Info.numerics`: their mode when they agree, `"mixed"` when they do not, empty when
/// none reports one (workers that predate the field; those are left out of the comparison).
pub fn combined_numerics<'a>(modes: impl IntoIterator<Item = &'a str>) -> String {
    let mut seen: Option<&str> = None;
    for mode in modes.into_iter().filter(|m| !m.is_empty()) {
        match seen {
            None => seen = Some(mode),
            Some(first) if first != mode => return "mixed".to_string(),
            Some(_) => {}
        }
    }
    seen.unwrap_or_default().to_string()
}

impl ModelTable {
    /// Takes the `Info` of the worker at `address`: the first worker of a model id describes the
    /// model; a later one under the same id must serve the same model (vocabulary, context, EOS).
    /// A worker that comes back with another model moves to that model. `built` is the model's
    /// context when the caller built it already (outside the lock); otherwise it is built here
    /// for a new id.
    ///
    /// Errors: a worker whose model differs from the one already served under its id, or whose
    /// model cannot be described (tokenizer, chat template).
    pub fn adopt(
        &mut self,
        address: &str,
        info: &InfoResponse,
        built: Option<Arc<ModelContext>>,
        template_file: Option<&ChatTemplateFile>,
    ) -> anyhow::Result<Arc<str>> {
        let id = announced_id(info);
        let id: Arc<str> = match self.models.get_key_value(id) {
            Some((key, existing)) => {
                if !existing.context.same_model(info) {
                    anyhow::bail!(
                        "worker {address} serves {:?} under the name {id:?}, but this router \
                         already serves another model under that name ({:?})",
                        info.model_name,
                        existing.context.model_name
                    );
                }
                key.clone()
            }
            None => {
                let id: Arc<str> = Arc::from(id);
                let block_size = info.stats.as_ref().map_or(0, |s| s.kv_block_size as usize);
                let context = match built {
                    Some(context) => context,
                    None => Arc::new(ModelContext::from_info(info, template_file)?),
                };
                tracing::info!(model = %id, worker = address, "serving a new model");
                self.models.insert(
                    id.clone(),
                    Arc::new(ServedModel {
                        id: id.clone(),
                        context,
                        block_size,
                    }),
                );
                id
            }
        };
        self.workers.insert(
            address.to_string(),
            Described {
                model: id.clone(),
                numerics: info.numerics.clone(),
            },
        );
        Ok(id)
    }

    /// Forgets the worker at `address` (removed from the pool).
    pub fn forget(&mut self, address: &str) {
        self.workers.remove(address);
    }

    /// The model the worker at `address` serves, once it described it.
    pub fn model_of(&self, address: &str) -> Option<&Arc<str>> {
        self.workers.get(address).map(|w| &w.model)
    }

    /// The numeric mode (`Info.numerics`) of the worker at `address`, once it described its model
    /// (empty from a worker that predates the field).
    pub fn numerics_of(&self, address: &str) -> Option<&str> {
        self.workers.get(address).map(|w| w.numerics.as_str())
    }

    /// The addresses of the workers that described the model `id`.
    pub fn workers_of<'a>(&'a self, id: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.workers
            .iter()
            .filter(move |(_, w)| &*w.model == id)
            .map(|(address, _)| address.as_str())
    }

    /// The model served under `id`.
    pub fn get(&self, id: &str) -> Option<&Arc<ServedModel>> {
        self.models.get(id)
    }

    /// Every served model, by id.
    pub fn all(&self) -> impl Iterator<Item = &Arc<ServedModel>> {
        self.models.values()
    }

    /// The served ids, sorted.
    pub fn ids(&self) -> Vec<&str> {
        self.models.keys().map(|k| &**k).collect()
    }

    /// The model a request naming `requested` gets under `naming` (see [`crate::model_choice`]);
    /// a model's descriptive name (`Info.model_name`) names it too. `Ok(None)` while no worker
    /// has described any model.
    ///
    /// Errors: [`ModelChoiceError`] (unknown name; no name while several are served).
    pub fn resolve(
        &self,
        requested: Option<&str>,
        naming: &ModelNaming,
    ) -> Result<Option<Arc<ServedModel>>, ModelChoiceError> {
        if self.models.is_empty() {
            return Ok(None);
        }
        if let Some(name) = requested {
            if let Some(model) = self.models.values().find(|m| m.context.model_name == name) {
                if !self.models.contains_key(name) {
                    return Ok(Some(model.clone()));
                }
            }
        }
        let ids = self.ids();
        let id = naming.choose(requested, &ids)?;
        Ok(self.models.get(id).cloned())
    }
}

#[cfg(test)]
mod tests {
    use super::combined_numerics;

    /// Workers that agree give their mode, disagreeing ones `mixed`; workers without a mode (older
    /// ones) are left out, and none at all gives empty.
    #[test]
    fn a_models_numerics_from_its_workers() {
        assert_eq!(combined_numerics(["fast", "fast"]), "fast");
        assert_eq!(combined_numerics(["exact", "", "exact"]), "exact");
        assert_eq!(combined_numerics(["exact", "fast", "exact"]), "mixed");
        assert_eq!(combined_numerics(["", "fast", "", "exact"]), "mixed");
        assert_eq!(combined_numerics([""]), "");
        assert_eq!(combined_numerics([]), "");
    }
}
