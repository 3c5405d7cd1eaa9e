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

#[cfg(feature = "providers")]
mod providers {
    use deepagents_models::http::{HttpConfig, ReqwestTransport, Secret};
    use deepagents_models::openai_chat::ChatWire;
    use deepagents_models::provider::HttpModel;
    use deepagents_models::{ModelOptions, SpecError, from_spec_with, profile_for};

    #[test]
    fn providers_resolve_with_their_profiles() {
        let options = ModelOptions {
            api_key: Some(Secret::new("k")),
            ..ModelOptions::default()
        };
        for (spec, window) in [
            ("openai:gpt-4o-mini", Some(128_000)),
            ("openai_chat:gpt-4.1", Some(1_047_576)),
            ("anthropic:claude-sonnet-4-5", Some(200_000)),
            ("google_genai:gemini-2.5-pro", Some(1_048_576)),
            ("openrouter:anthropic/claude-opus-4-1", Some(200_000)),
            ("ollama:some-local-model", None),
        ] {
            let model = from_spec_with(spec, &options).unwrap();
            assert_eq!(model.id(), spec);
            assert_eq!(
                model.profile().map(|p| p.max_input_tokens),
                window,
                "{spec}"
            );
        }
        assert_eq!(
            profile_for("claude-opus-4-1-20250805")
                .unwrap()
                .max_output_tokens,
            32_000
        );
        assert_eq!(
            profile_for("claude-opus-4-5").unwrap().max_output_tokens,
            64_000
        );
        let custom = deepagents_core::ModelProfile {
            max_input_tokens: 32_768,
            max_output_tokens: 4_096,
        };
        let model = from_spec_with(
            "ollama:some-local-model",
            &ModelOptions {
                profile: Some(custom),
                ..ModelOptions::default()
            },
        )
        .unwrap();
        assert_eq!(model.profile(), Some(custom), "the profile is overridable");
    }

    #[test]
    fn spec_errors_say_what_to_do() {
        let error = from_spec_with("openai_compatible:qwen3", &ModelOptions::default())
            .err()
            .unwrap();
        assert!(matches!(error, SpecError::MissingBaseUrl { .. }));
        assert!(
            error.to_string().contains("needs a base URL: set"),
            "{error}"
        );
        let error = from_spec_with("anthropic:", &ModelOptions::default())
            .err()
            .unwrap();
        assert!(matches!(error, SpecError::MissingModel { .. }), "{error}");
        let error = from_spec_with("acme:x", &ModelOptions::default())
            .err()
            .unwrap();
        for known in [
            "openai:MODEL",
            "anthropic:MODEL",
            "google_genai:MODEL",
            "replay:PATH",
        ] {
            assert!(error.to_string().contains(known), "{error}");
        }
        let error = from_spec_with("replay:/no/such/cassette.json", &ModelOptions::default())
            .err()
            .unwrap();
        assert!(
            error.to_string().contains("/no/such/cassette.json"),
            "{error}"
        );
    }

    #[test]
    fn a_model_debug_shows_no_key() {
        let config = HttpConfig::default();
        let model = HttpModel::new(
            "openai_chat:gpt-4o".into(),
            ChatWire {
                provider: "openai_chat".into(),
                base_url: "http://127.0.0.1:1/v1".into(),
                model: "gpt-4o".into(),
                stream_usage: true,
                extra_headers: vec![],
                reasoning: None,
                modalities: deepagents_core::model::InputModalities::ALL,
                max_output_tokens: None,
                legacy_max_tokens: false,
            },
            Some(Secret::new("sk-very-secret")),
            config.clone(),
            std::sync::Arc::new(ReqwestTransport::new(&config).unwrap()),
            None,
            true,
        );
        let shown = format!("{model:?}");
        assert!(!shown.contains("sk-very-secret"), "{shown}");
        assert!(shown.contains("redacted"), "{shown}");
    }
}
