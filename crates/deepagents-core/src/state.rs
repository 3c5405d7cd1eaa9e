//! The agent state and the rules that merge updates into it.
//!
//! Tools never mutate state directly: they return a [`StateUpdate`], and the run applies the
//! updates of one step in tool-call order through a [`StateSchema`]. Concurrent tools therefore
//! never race, and the outcome is the same on every run.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::content::base64_bytes;
use crate::message::{Message, Messages};

/// Everything an agent knows; plain data, persisted as is by checkpoints.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentState {
    /// The conversation (shared with the requests made from it, see [`Messages`]).
    #[serde(default)]
    pub messages: Messages,
    /// The plan kept by the `write_todos` tool.
    #[serde(default)]
    pub todos: Vec<Todo>,
    /// Files of the state backend, keyed by absolute virtual path.
    #[serde(default)]
    pub files: BTreeMap<String, FileData>,
    /// Values declared by middleware or the application, keyed by name.
    #[serde(default)]
    pub custom: BTreeMap<String, Value>,
}

/// One item of the plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Todo {
    /// What to do, as one short imperative sentence.
    pub content: String,
    /// Where the item stands.
    pub status: TodoStatus,
}

/// Progress of a [`Todo`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TodoStatus {
    /// Not started.
    Pending,
    /// Being worked on now.
    InProgress,
    /// Done.
    Completed,
}

/// A file kept in the agent state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileData {
    /// The bytes or text.
    pub content: FileContent,
    /// Last modification, in milliseconds since the Unix epoch.
    pub modified_at_ms: u64,
    /// When the file was first written, in milliseconds since the Unix epoch; 0 when unknown
    /// (files written by an earlier version).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub created_at_ms: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

impl FileData {
    /// This file as a new version of `previous` (the file it replaces, if any): it keeps
    /// the creation time of the first version.
    pub fn replacing(mut self, previous: Option<&FileData>) -> Self {
        if let Some(previous) = previous {
            self.created_at_ms = if previous.created_at_ms != 0 {
                previous.created_at_ms
            } else {
                previous.modified_at_ms.min(self.modified_at_ms)
            };
        }
        self
    }
}

/// Contents of a [`FileData`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "encoding", rename_all = "snake_case")]
pub enum FileContent {
    /// UTF-8 text.
    Text {
        /// The text.
        text: String,
    },
    /// Anything else.
    Binary {
        /// IANA media type.
        mime_type: String,
        /// The bytes (base64 in JSON).
        #[serde(with = "base64_bytes")]
        #[schemars(with = "String")]
        data: Vec<u8>,
    },
}

/// Changes proposed by a tool or middleware; merged by a [`StateSchema`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StateUpdate {
    /// A new plan, replacing the old one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub todos: Option<Vec<Todo>>,
    /// Files to write (`Some`) or delete (`None`, a tombstone), by path.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, Option<FileData>>,
    /// New values for declared custom keys, merged by each key's [`Reducer`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub custom: BTreeMap<String, Value>,
    /// When set, the conversation's messages from this index on are dropped before
    /// [`messages`](Self::messages) are appended: how a middleware rewrites or trims history.
    /// Past the end it drops nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages_from: Option<usize>,
    /// Messages appended to the conversation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<Message>,
}

impl StateUpdate {
    /// Whether the update changes nothing.
    pub fn is_empty(&self) -> bool {
        self.todos.is_none()
            && self.files.is_empty()
            && self.custom.is_empty()
            && self.messages_from.is_none()
            && self.messages.is_empty()
    }

    /// An update that replaces the plan.
    pub fn todos(todos: Vec<Todo>) -> Self {
        Self {
            todos: Some(todos),
            ..Self::default()
        }
    }

    /// Adds a custom value to the update.
    pub fn with_custom(mut self, key: impl Into<String>, value: Value) -> Self {
        self.custom.insert(key.into(), value);
        self
    }
}

/// A user-supplied merge function: `(current, update) -> merged`.
pub type ReduceFn = dyn Fn(Option<&Value>, Value) -> Result<Value, String> + Send + Sync;

/// How updates to one custom key merge with its current value.
#[derive(Clone)]
pub enum Reducer {
    /// The update replaces the value; among concurrent updates the last in call order wins.
    Replace,
    /// Arrays concatenate; a non-array update is pushed as one element.
    Append,
    /// Objects merge key by key, the update's keys winning.
    MergeMap,
    /// A user function.
    Custom(Arc<ReduceFn>),
}

impl fmt::Debug for Reducer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Replace => "Replace",
            Self::Append => "Append",
            Self::MergeMap => "MergeMap",
            Self::Custom(_) => "Custom(..)",
        })
    }
}

impl Reducer {
    /// A reducer from a closure.
    pub fn custom(
        f: impl Fn(Option<&Value>, Value) -> Result<Value, String> + Send + Sync + 'static,
    ) -> Self {
        Self::Custom(Arc::new(f))
    }

    fn reduce(&self, current: Option<&Value>, update: Value) -> Result<Value, String> {
        match self {
            Self::Replace => Ok(update),
            Self::Append => {
                let mut items = match current {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(items)) => items.clone(),
                    Some(other) => {
                        return Err(format!("current value is not an array: {other}"));
                    }
                };
                match update {
                    Value::Array(more) => items.extend(more),
                    one => items.push(one),
                }
                Ok(Value::Array(items))
            }
            Self::MergeMap => {
                let mut map = match current {
                    None | Some(Value::Null) => serde_json::Map::new(),
                    Some(Value::Object(map)) => map.clone(),
                    Some(other) => {
                        return Err(format!("current value is not an object: {other}"));
                    }
                };
                match update {
                    Value::Object(more) => map.extend(more),
                    other => return Err(format!("update is not an object: {other}")),
                }
                Ok(Value::Object(map))
            }
            Self::Custom(f) => f(current, update),
        }
    }
}

/// Why an update could not be merged. These are programming errors in a tool or middleware,
/// not something the model can fix, so they stop the run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// The key was never declared.
    #[error(
        "custom state key `{key}` was never declared; declare it with a reducer (AgentBuilder::state_value or Middleware::state_values) before updating it"
    )]
    UndeclaredKey {
        /// The key.
        key: String,
    },
    /// Two declarations of one key disagree.
    #[error("custom state key `{key}` is declared twice ({first} and {second}); use one reducer")]
    ConflictingDeclaration {
        /// The key.
        key: String,
        /// The first reducer.
        first: String,
        /// The second reducer.
        second: String,
    },
    /// A tool's update rewrote earlier messages: a step's results must follow its calls.
    #[error(
        "a tool's state update cannot rewrite earlier messages (messages_from); it may only append messages, which follow the step's results"
    )]
    ToolRewroteMessages,
    /// The reducer refused the update.
    #[error("cannot merge the update of custom state key `{key}`: {message}")]
    Reduce {
        /// The key.
        key: String,
        /// The reducer's reason.
        message: String,
    },
    /// Two owners (the application, a middleware) claim one key.
    #[error(
        "custom state key `{key}` is used by both {first} and {second}; rename one (a middleware that replaces a built-in one takes over its keys)"
    )]
    KeyClash {
        /// The key.
        key: String,
        /// Who declared it first.
        first: String,
        /// Who declared it again.
        second: String,
    },
    /// A value in the state is not what its key holds.
    #[error(
        "custom state key `{key}` holds a value this version cannot read ({message}); the thread was written by another version or edited by hand: fix or remove that value"
    )]
    Decode {
        /// The key.
        key: String,
        /// What is wrong with the value.
        message: String,
    },
    /// A value could not be turned into JSON.
    #[error("cannot store the value of custom state key `{key}`: {message}")]
    Encode {
        /// The key.
        key: String,
        /// Why.
        message: String,
    },
}

/// A typed handle on one custom state key: reads fail loudly, naming the key, instead of
/// silently falling back to a default.
pub struct StateKey<T> {
    name: &'static str,
    value: std::marker::PhantomData<fn() -> T>,
}

impl<T> Clone for StateKey<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for StateKey<T> {}

impl<T> fmt::Debug for StateKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StateKey({})", self.name)
    }
}

impl<T: Serialize + serde::de::DeserializeOwned> StateKey<T> {
    /// The key named `name`.
    pub const fn new(name: &'static str) -> Self {
        Self {
            name,
            value: std::marker::PhantomData,
        }
    }

    /// The key's name in [`AgentState::custom`].
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// The value in `state`, `None` when the key is absent.
    pub fn get(&self, state: &AgentState) -> Result<Option<T>, StateError> {
        self.decode(state.custom.get(self.name))
    }

    /// Decodes a raw value of this key.
    pub fn decode(&self, value: Option<&Value>) -> Result<Option<T>, StateError> {
        value
            .map(|value| {
                T::deserialize(value).map_err(|e| StateError::Decode {
                    key: self.name.to_owned(),
                    message: e.to_string(),
                })
            })
            .transpose()
    }

    /// Adds "set this key to `value`" to `update`.
    pub fn set(&self, update: &mut StateUpdate, value: &T) -> Result<(), StateError> {
        let json = serde_json::to_value(value).map_err(|e| StateError::Encode {
            key: self.name.to_owned(),
            message: e.to_string(),
        })?;
        update.custom.insert(self.name.to_owned(), json);
        Ok(())
    }

    /// An update that sets this key to `value`.
    pub fn update(&self, value: &T) -> Result<StateUpdate, StateError> {
        let mut update = StateUpdate::default();
        self.set(&mut update, value)?;
        Ok(update)
    }
}

/// The declared custom keys and their reducers.
#[derive(Clone, Debug, Default)]
pub struct StateSchema {
    reducers: BTreeMap<String, Reducer>,
    /// Who declared each key, for those declared with [`declare_for`](Self::declare_for).
    owners: BTreeMap<String, String>,
}

impl StateSchema {
    /// Declares `key` on behalf of `owner` (the application, a middleware): a key another
    /// owner declared is refused, so no two parties share a value by accident.
    pub fn declare_for(
        &mut self,
        owner: &str,
        key: impl Into<String>,
        reducer: Reducer,
    ) -> Result<(), StateError> {
        let key = key.into();
        if let Some(first) = self.owners.get(&key)
            && first != owner
        {
            return Err(StateError::KeyClash {
                key,
                first: first.clone(),
                second: owner.to_owned(),
            });
        }
        self.declare(key.clone(), reducer)?;
        self.owners.insert(key, owner.to_owned());
        Ok(())
    }

    /// Declares `key`. Declaring a key again with the same built-in reducer is allowed (two
    /// middleware may share a key); any other second declaration is refused.
    pub fn declare(&mut self, key: impl Into<String>, reducer: Reducer) -> Result<(), StateError> {
        let key = key.into();
        if let Some(existing) = self.reducers.get(&key) {
            let same = matches!(
                (existing, &reducer),
                (Reducer::Replace, Reducer::Replace)
                    | (Reducer::Append, Reducer::Append)
                    | (Reducer::MergeMap, Reducer::MergeMap)
            );
            if same {
                return Ok(());
            }
            return Err(StateError::ConflictingDeclaration {
                first: format!("{existing:?}"),
                second: format!("{reducer:?}"),
                key,
            });
        }
        self.reducers.insert(key, reducer);
        Ok(())
    }

    /// Merges `updates` into `state` in order. All-or-nothing: on error `state` is unchanged.
    pub fn apply_all(
        &self,
        state: &mut AgentState,
        updates: impl IntoIterator<Item = StateUpdate>,
    ) -> Result<(), StateError> {
        let mut todos = None;
        let mut files: BTreeMap<String, Option<FileData>> = BTreeMap::new();
        let mut custom: BTreeMap<String, Value> = BTreeMap::new();
        let mut messages: Vec<(Option<usize>, Vec<Message>)> = Vec::new();
        for update in updates {
            if update.todos.is_some() {
                todos = update.todos;
            }
            if update.messages_from.is_some() || !update.messages.is_empty() {
                messages.push((update.messages_from, update.messages));
            }
            files.extend(update.files);
            for (key, value) in update.custom {
                let reducer = self
                    .reducers
                    .get(&key)
                    .ok_or_else(|| StateError::UndeclaredKey { key: key.clone() })?;
                let current = custom.get(&key).or_else(|| state.custom.get(&key));
                let merged =
                    reducer
                        .reduce(current, value)
                        .map_err(|message| StateError::Reduce {
                            key: key.clone(),
                            message,
                        })?;
                custom.insert(key, merged);
            }
        }
        if let Some(todos) = todos {
            state.todos = todos;
        }
        for (path, file) in files {
            match file {
                Some(file) => state.files.insert(path, file),
                None => state.files.remove(&path),
            };
        }
        state.custom.extend(custom);
        for (from, appended) in messages {
            if let Some(from) = from {
                state.messages.truncate(from);
            }
            state.messages.extend(appended);
        }
        Ok(())
    }
}
