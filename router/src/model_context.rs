//! What the router knows about the served model, built from a worker's `Info`: the tokenizer, the chat
//! template, the EOS ids and the context length.

use std::sync::{Arc, OnceLock};

use inference_proto::worker::InfoResponse;
use structured_output::tool_call::ToolSyntax;
use structured_output::{ConstraintCompiler, VocabError};
use structured_wire::compiler_from_info;
use tokenizer::TextTokenizer;

use crate::chat_template::{builtin_template, ChatTemplate, ChatTemplateError};

/// Why the `chat_template` setting's file cannot be used. The messages name the file and hold the
/// cause's text (so the error has no separate source).
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateFileError {
    /// The file cannot be read (or is not UTF-8).
    #[error("chat_template {path:?}: cannot read it: {error}")]
    Read {
        /// The file, as the setting names it.
        path: String,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The template does not compile.
    #[error("chat_template {path:?}: {error}")]
    Invalid {
        /// The file, as the setting names it.
        path: String,
        /// Why it does not compile.
        error: ChatTemplateError,
    },
}

/// A chat template read from the file named by the router's `chat_template` setting; it overrides
/// the model's own and the built-in ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTemplateFile {
    /// The file, as the setting names it.
    pub path: String,
    /// Its Jinja source.
    pub source: String,
}

impl ChatTemplateFile {
    /// Reads and compiles the template at `path`.
    ///
    /// Errors: [`ChatTemplateFileError`], naming the file (unreadable, not UTF-8, or a template
    /// that does not compile).
    pub fn read(path: &str) -> Result<Self, ChatTemplateFileError> {
        let source =
            std::fs::read_to_string(path).map_err(|error| ChatTemplateFileError::Read {
                path: path.to_string(),
                error,
            })?;
        ChatTemplate::new(&source, None, None).map_err(|error| ChatTemplateFileError::Invalid {
            path: path.to_string(),
            error,
        })?;
        Ok(Self {
            path: path.to_string(),
            source,
        })
    }
}

/// The served model as the router sees it. Shared (read-only) by every request.
pub struct ModelContext {
    /// Model name as the worker reports it.
    pub model_name: String,
    /// Architecture (`general.architecture`), e.g. "llama".
    pub architecture: String,
    /// Context length, in tokens.
    pub context_length: u32,
    /// Vocabulary size.
    pub vocab_size: u32,
    /// Ids that end generation unless the request sets `ignore_eos`.
    pub eos_token_ids: Vec<u32>,
    /// BOS id, when the model has one.
    pub bos_token_id: Option<u32>,
    /// Whether the tokenizer prepends BOS to prompts.
    pub add_bos_token: bool,
    /// The template's Jinja source (empty when there is none).
    pub chat_template_source: String,
    /// Where the template comes from: `"setting FILE"`, `"model file"`, `"built-in NAME"`, or empty.
    pub chat_template_origin: String,
    /// The compiled chat template, when the model has one.
    pub chat_template: Option<ChatTemplate>,
    /// The syntax of tool calls: the template's own ([`ToolSyntax::of_template`]), else the
    /// built-in Hermes format.
    pub tool_syntax: ToolSyntax,
    /// Whether the template renders `tools` itself (else the built-in tool prompt is used).
    pub template_has_tools: bool,
    /// The tokenizer.
    pub tokenizer: Arc<TextTokenizer>,
    /// Structured output over the model's vocabulary (the same token environment the worker
    /// builds), built on its own thread.
    pub constraints: StructuredOutput,
}

impl ModelContext {
    /// Builds the tokenizer and chat template from a worker's `Info`. The template is, in order of
    /// precedence: `template_file` (the `chat_template` setting), the model file's own
    /// (`Info.chat_template`), or the built-in one for the architecture
    /// ([`crate::chat_template::builtin_template`]); none when none applies.
    ///
    /// Errors: no tokenizer in `Info`, a tokenizer that cannot be built, or a template that does not
    /// compile.
    pub fn from_info(
        info: &InfoResponse,
        template_file: Option<&ChatTemplateFile>,
    ) -> anyhow::Result<Self> {
        let spec = info
            .tokenizer
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("the worker's Info has no tokenizer"))?;
        let tokenizer = Arc::new(TextTokenizer::from_spec(spec)?);
        let token_string =
            |id: Option<u32>| id.and_then(|id| spec.tokens.get(id as usize).cloned());
        let eos = info.eos_token_ids.first().copied();
        let (source, origin) = if let Some(file) = template_file {
            (file.source.clone(), format!("setting {}", file.path))
        } else if !info.chat_template.is_empty() {
            (info.chat_template.clone(), "model file".to_string())
        } else if let Some(builtin) = builtin_template(&info.architecture, |text| {
            tokenizer.token_id(text).is_some()
        }) {
            tracing::info!(
                model = %info.model_name,
                template = builtin.name,
                "the model has no chat template of its own: chat requests use the built-in \
                 template (replace it with the chat_template setting)"
            );
            (
                builtin.source.to_string(),
                format!("built-in {}", builtin.name),
            )
        } else {
            (String::new(), String::new())
        };
        let chat_template = if source.is_empty() {
            None
        } else {
            Some(ChatTemplate::new(
                &source,
                token_string(info.bos_token_id),
                token_string(eos),
            )?)
        };
        let constraints = StructuredOutput::build(info.clone());
        let own_tools = ToolSyntax::of_template(&source);
        Ok(Self {
            tool_syntax: own_tools.unwrap_or(ToolSyntax::builtin()),
            template_has_tools: own_tools.is_some(),
            constraints,
            model_name: info.model_name.clone(),
            architecture: info.architecture.clone(),
            context_length: info.context_length,
            vocab_size: info.vocab_size,
            eos_token_ids: info.eos_token_ids.clone(),
            bos_token_id: info.bos_token_id,
            add_bos_token: spec.add_bos_token,
            chat_template_source: source,
            chat_template_origin: origin,
            chat_template,
            tokenizer,
        })
    }

    /// Whether another worker's `Info` describes the same model (so it can share this tokenizer).
    pub fn same_model(&self, info: &InfoResponse) -> bool {
        self.model_name == info.model_name
            && self.vocab_size == info.vocab_size
            && self.context_length == info.context_length
            && self.eos_token_ids == info.eos_token_ids
    }
}

/// Why the served model has no structured-output compiler. The messages hold the cause's text (so
/// the error has no separate source); the router puts them in the `constraint` refusal it sends.
#[derive(Debug, thiserror::Error)]
pub enum StructuredOutputUnavailable {
    /// The thread that builds the compiler could not be started.
    #[error("cannot start its build thread: {error}")]
    BuildThread {
        /// Why the thread did not start.
        error: std::io::Error,
    },
    /// The model's vocabulary cannot serve structured output.
    #[error("{error}")]
    Vocabulary {
        /// What llguidance or the vocabulary check refused.
        error: VocabError,
    },
}

/// The model's structured-output compiler, built on a thread of its own when the model becomes
/// known (0.2 s for a 49k-token vocabulary, seconds for a 262k one: not on the async runtime, nor
/// under the pool's model lock).
#[derive(Clone)]
pub struct StructuredOutput {
    compiler: Arc<OnceLock<Result<ConstraintCompiler, StructuredOutputUnavailable>>>,
}

impl StructuredOutput {
    /// Starts building the compiler of the model `info` describes.
    fn build(info: InfoResponse) -> Self {
        let compiler = Arc::new(OnceLock::new());
        let cell = compiler.clone();
        let build = move || {
            let started = std::time::Instant::now();
            let built = compiler_from_info(&info)
                .map_err(|error| StructuredOutputUnavailable::Vocabulary { error });
            match &built {
                Ok(_) => tracing::info!(
                    ms = started.elapsed().as_millis() as u64,
                    "structured output ready"
                ),
                Err(reason) => {
                    tracing::warn!(%reason, "structured output unavailable for this model")
                }
            }
            let _ = cell.set(built);
        };
        if let Err(error) = std::thread::Builder::new()
            .name("structured-output".into())
            .spawn(build)
        {
            let _ = compiler.set(Err(StructuredOutputUnavailable::BuildThread { error }));
        }
        Self { compiler }
    }

    /// The compiler, or why this model cannot have one; blocks until it is built (call it off the
    /// async runtime).
    ///
    /// Errors: [`StructuredOutputUnavailable`], the same one on every call.
    pub fn wait(&self) -> Result<&ConstraintCompiler, &StructuredOutputUnavailable> {
        self.compiler.wait().as_ref()
    }
}
