//! Merge rules of the agent state.

use deepagents_core::{
    AgentState, FileContent, FileData, Reducer, StateError, StateSchema, StateUpdate, Todo,
    TodoStatus,
};
use serde_json::{Value, json};

fn file(text: &str) -> Option<FileData> {
    Some(FileData {
        content: FileContent::Text { text: text.into() },
        modified_at_ms: 0,
        created_at_ms: 0,
    })
}

fn schema() -> StateSchema {
    let mut schema = StateSchema::default();
    schema.declare("list", Reducer::Append).unwrap();
    schema.declare("map", Reducer::MergeMap).unwrap();
    schema.declare("value", Reducer::Replace).unwrap();
    schema
}

#[test]
fn updates_apply_in_order_with_each_rule() {
    let mut state = AgentState::default();
    let updates = vec![
        StateUpdate {
            files: [("/a".to_owned(), file("one")), ("/b".to_owned(), file("b"))].into(),
            ..StateUpdate::todos(vec![Todo {
                content: "first".into(),
                status: TodoStatus::Pending,
            }])
        }
        .with_custom("list", json!([1, 2]))
        .with_custom("map", json!({"x": 1}))
        .with_custom("value", json!("first")),
        StateUpdate {
            files: [("/a".to_owned(), file("two")), ("/b".to_owned(), None)].into(),
            ..StateUpdate::todos(vec![])
        }
        .with_custom("list", json!(3))
        .with_custom("map", json!({"y": 2, "x": 3}))
        .with_custom("value", json!("second")),
    ];
    schema().apply_all(&mut state, updates).unwrap();
    assert!(
        state.todos.is_empty(),
        "the later plan replaces the earlier one"
    );
    assert_eq!(state.files.len(), 1, "the tombstone deleted /b");
    assert_eq!(state.files["/a"], file("two").unwrap());
    assert_eq!(state.custom["list"], json!([1, 2, 3]));
    assert_eq!(state.custom["map"], json!({"x": 3, "y": 2}));
    assert_eq!(state.custom["value"], json!("second"));
}

#[test]
fn a_failed_merge_changes_nothing() {
    let mut state = AgentState::default();
    state.custom.insert("map".into(), json!({"keep": true}));
    let before = state.clone();
    let updates = vec![
        StateUpdate::default().with_custom("value", json!(1)),
        StateUpdate::default().with_custom("map", json!("not an object")),
    ];
    let error = schema().apply_all(&mut state, updates).unwrap_err();
    assert!(matches!(error, StateError::Reduce { ref key, .. } if key == "map"));
    assert!(
        error.to_string().contains("update is not an object"),
        "{error}"
    );
    assert_eq!(state, before);
}

#[test]
fn undeclared_keys_and_conflicting_declarations_are_errors() {
    let mut state = AgentState::default();
    let error = schema()
        .apply_all(
            &mut state,
            [StateUpdate::default().with_custom("nope", Value::Null)],
        )
        .unwrap_err();
    assert_eq!(error, StateError::UndeclaredKey { key: "nope".into() });

    let mut schema = schema();
    schema.declare("list", Reducer::Append).unwrap();
    let conflict = schema.declare("list", Reducer::Replace).unwrap_err();
    assert!(matches!(
        conflict,
        StateError::ConflictingDeclaration { .. }
    ));
}

#[test]
fn a_custom_reducer_sees_the_value_merged_so_far() {
    let mut schema = StateSchema::default();
    schema
        .declare(
            "max",
            Reducer::custom(|current, update| {
                let current = current.and_then(Value::as_i64).unwrap_or(i64::MIN);
                let update = update.as_i64().ok_or("max takes integers")?;
                Ok(json!(current.max(update)))
            }),
        )
        .unwrap();
    let mut state = AgentState::default();
    let updates = [3, 9, 4].map(|n| StateUpdate::default().with_custom("max", json!(n)));
    schema.apply_all(&mut state, updates).unwrap();
    assert_eq!(state.custom["max"], json!(9));
    let error = schema
        .apply_all(
            &mut state,
            [StateUpdate::default().with_custom("max", json!("x"))],
        )
        .unwrap_err();
    assert!(error.to_string().contains("max takes integers"), "{error}");
}

#[test]
fn messages_are_shared_until_one_side_changes_them() {
    use deepagents_core::{Message, Messages};
    let mut run: Messages = vec![Message::user("a")].into();
    let request = run.clone();
    // Shared: the same list, not a copy.
    assert!(std::ptr::eq(run.as_ptr(), request.as_ptr()));
    run.push(Message::user("b"));
    // The request keeps what it was given; the run has its own list now.
    assert_eq!(request.len(), 1);
    assert_eq!(run.len(), 2);
    drop(request);
    run.push(Message::user("c"));
    assert_eq!(
        run,
        vec![Message::user("a"), Message::user("b"), Message::user("c")]
    );
    // Serialized as a plain list.
    assert_eq!(
        serde_json::to_value(&run).unwrap(),
        serde_json::to_value(run.to_vec()).unwrap()
    );
    let back: Messages = serde_json::from_value(serde_json::to_value(&run).unwrap()).unwrap();
    assert_eq!(back, run);
}

fn conversation(texts: &[&str]) -> AgentState {
    let mut state = AgentState::default();
    for text in texts {
        state.messages.push(deepagents_core::Message::user(*text));
    }
    state
}

fn texts(state: &AgentState) -> Vec<String> {
    state.messages.iter().map(|m| m.text()).collect()
}

fn appending(texts: &[&str]) -> StateUpdate {
    StateUpdate {
        messages: texts
            .iter()
            .map(|text| deepagents_core::Message::user(*text))
            .collect(),
        ..StateUpdate::default()
    }
}

#[test]
fn messages_of_an_update_are_appended_in_update_order() {
    let mut state = conversation(&["a"]);
    let updates = [appending(&["b", "c"]), appending(&["d"])];
    StateSchema::default()
        .apply_all(&mut state, updates)
        .unwrap();
    assert_eq!(texts(&state), ["a", "b", "c", "d"]);
}

#[test]
fn messages_from_drops_the_tail_before_appending() {
    let mut state = conversation(&["a", "b", "c", "d"]);
    let update = StateUpdate {
        messages_from: Some(1),
        ..appending(&["x"])
    };
    StateSchema::default()
        .apply_all(&mut state, [update])
        .unwrap();
    assert_eq!(texts(&state), ["a", "x"]);

    // From 0 with nothing appended empties the conversation.
    let clear = StateUpdate {
        messages_from: Some(0),
        ..StateUpdate::default()
    };
    StateSchema::default()
        .apply_all(&mut state, [clear])
        .unwrap();
    assert!(state.messages.is_empty());

    // Later updates of one batch see the conversation the earlier ones left.
    let mut state = conversation(&["a", "b", "c"]);
    let updates = [
        appending(&["d"]),
        StateUpdate {
            messages_from: Some(3),
            ..appending(&["e"])
        },
    ];
    StateSchema::default()
        .apply_all(&mut state, updates)
        .unwrap();
    assert_eq!(texts(&state), ["a", "b", "c", "e"]);
}

#[test]
fn messages_from_past_the_end_drops_nothing() {
    let mut state = conversation(&["a", "b"]);
    let update = StateUpdate {
        messages_from: Some(10),
        ..appending(&["c"])
    };
    StateSchema::default()
        .apply_all(&mut state, [update])
        .unwrap();
    assert_eq!(texts(&state), ["a", "b", "c"]);
    let at_the_end = StateUpdate {
        messages_from: Some(3),
        ..StateUpdate::default()
    };
    StateSchema::default()
        .apply_all(&mut state, [at_the_end])
        .unwrap();
    assert_eq!(texts(&state), ["a", "b", "c"]);
}

#[test]
fn an_update_with_messages_or_messages_from_is_not_empty() {
    assert!(StateUpdate::default().is_empty());
    assert!(!appending(&["a"]).is_empty());
    let truncating = StateUpdate {
        messages_from: Some(0),
        ..StateUpdate::default()
    };
    assert!(!truncating.is_empty());
}

#[test]
fn an_update_with_messages_round_trips_and_one_without_omits_the_keys() {
    let update = StateUpdate {
        messages_from: Some(2),
        ..appending(&["kept", "summary"])
    }
    .with_custom("value", json!(1));
    let json = serde_json::to_value(&update).unwrap();
    assert_eq!(json["messages_from"], json!(2));
    assert_eq!(json["messages"].as_array().unwrap().len(), 2);
    let back: StateUpdate = serde_json::from_value(json).unwrap();
    assert_eq!(back, update);

    // Updates written before these fields existed (checkpoints) read the same, and an update
    // without messages is written as before.
    let plain = StateUpdate::default().with_custom("value", json!(1));
    let json = serde_json::to_value(&plain).unwrap();
    assert_eq!(json, json!({"custom": {"value": 1}}));
    let old: StateUpdate = serde_json::from_value(json!({"custom": {"value": 1}})).unwrap();
    assert_eq!(old, plain);
}

#[test]
fn a_failed_merge_leaves_the_messages_alone() {
    let mut state = conversation(&["a", "b"]);
    let before = state.clone();
    let updates = [
        StateUpdate {
            messages_from: Some(0),
            ..appending(&["x"])
        },
        StateUpdate::default().with_custom("nope", json!(1)),
    ];
    let error = schema().apply_all(&mut state, updates).unwrap_err();
    assert_eq!(error, StateError::UndeclaredKey { key: "nope".into() });
    assert_eq!(state, before);
}
