//! `provider:model` resolution.

use deepagents_models::{SpecError, from_spec};

#[test]
fn scripted_specs_load_their_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.json");
    std::fs::write(&path, r#"{"turns": []}"#).unwrap();
    let model = from_spec(&format!("scripted:{}", path.display())).unwrap();
    assert_eq!(model.id(), format!("scripted:{}", path.display()));
}

#[test]
fn bad_specs_say_what_is_supported() {
    let error = from_spec("gpt-5").err().unwrap();
    assert!(matches!(error, SpecError::MissingProvider { .. }));
    assert!(error.to_string().contains("provider:model"), "{error}");
    let error = from_spec("acme:model-1").err().unwrap();
    assert!(
        error.to_string().contains("unknown model provider `acme`"),
        "{error}"
    );
    assert!(error.to_string().contains("scripted:PATH"), "{error}");
}
