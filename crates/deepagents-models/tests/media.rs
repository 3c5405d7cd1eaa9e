//! Images, PDFs, audio and other binary content on every wire format: each kind the API and
//! the model's profile accept goes in the API's shape, every other kind becomes a note.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use deepagents_core::ContentBlock;
use deepagents_core::message::{AssistantMessage, Message, ToolCall, ToolResult, ToolStatus};
use deepagents_core::model::{InputModalities, ModelRequest};
use deepagents_models::http::Secret;
use deepagents_models::{ModelOptions, from_spec_with, modalities_for};
use serde_json::{Value, json};
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::common::*;

const PNG: &[u8] = b"\x89PNG\r\n\x1a\nfake";
const PDF: &[u8] = b"%PDF-1.7 fake report";
const WAV: &[u8] = b"RIFF\x24\x00\x00\x00WAVEfmt fake";

fn b64(data: &[u8]) -> String {
    STANDARD.encode(data)
}

fn data_url(mime_type: &str, data: &[u8]) -> String {
    format!("data:{mime_type};base64,{}", b64(data))
}

fn audio_note() -> String {
    format!(
        "[Audio (audio/wav, {} bytes) was omitted: this model cannot listen to audio. Ask for a transcript instead.]",
        WAV.len()
    )
}

fn pdf_note() -> String {
    format!(
        "[A PDF (application/pdf, {} bytes) was omitted: this model cannot read PDFs. Ask for its text instead, e.g. read it with a tool that extracts text.]",
        PDF.len()
    )
}

fn image_note() -> String {
    format!(
        "[An image (image/png, {} bytes) was omitted: this model cannot view images. Ask for a description of it instead, or extract any text in it with a tool.]",
        PNG.len()
    )
}

/// A user message and a tool result that each carry `media` after a line of text.
fn request_with(media: &[ContentBlock]) -> ModelRequest {
    let call = ToolCall {
        id: "call_1".into(),
        name: "fetch".into(),
        arguments: json!({}),
    };
    let mut user = vec![ContentBlock::text("Compare these.")];
    user.extend_from_slice(media);
    let mut tool = vec![ContentBlock::text("Fetched.")];
    tool.extend_from_slice(media);
    ModelRequest {
        system_prompt: Some("Be brief.".into()),
        messages: vec![
            Message::User { content: user },
            Message::Assistant(AssistantMessage {
                content: vec![],
                tool_calls: vec![call],
            }),
            Message::Tool(ToolResult {
                tool_call_id: "call_1".into(),
                name: "fetch".into(),
                content: tool,
                status: ToolStatus::Ok,
                artifact: None,
            }),
        ]
        .into(),
        ..ModelRequest::default()
    }
}

/// An image, a PDF and audio.
fn media_request() -> ModelRequest {
    request_with(&[
        ContentBlock::data("image/png", PNG),
        ContentBlock::data("application/pdf", PDF),
        ContentBlock::data("audio/wav", WAV),
    ])
}

fn api_of(spec: &str) -> Api {
    match spec.split_once(':').map(|(provider, _)| provider) {
        Some("openai") => Api::Responses,
        Some("anthropic") => Api::Anthropic,
        Some("google_genai") => Api::Gemini,
        _ => Api::Chat,
    }
}

/// A successful answer in the API's shape.
fn answer(api: Api) -> Value {
    match api {
        Api::Chat => {
            json!({"choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]})
        }
        Api::Responses => json!({"status": "completed", "output": []}),
        Api::Anthropic => {
            json!({"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "usage": {"input_tokens": 1, "output_tokens": 1}})
        }
        Api::Gemini => {
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "ok"}]}, "finishReason": "STOP"}]})
        }
    }
}

/// The body `spec` sends for `request`, with `modalities` overriding its profile when given.
async fn sent(spec: &str, modalities: Option<InputModalities>, request: &ModelRequest) -> Value {
    let api = api_of(spec);
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(answer(api)))
        .mount(&server)
        .await;
    let base_url = match api {
        Api::Chat | Api::Responses => format!("{}/v1", server.uri()),
        Api::Anthropic | Api::Gemini => server.uri(),
    };
    let model = from_spec_with(
        spec,
        &ModelOptions {
            base_url: Some(base_url),
            api_key: Some(Secret::new(TEST_KEY)),
            http: Some(fast_config()),
            max_retries: Some(0),
            modalities,
            ..ModelOptions::default()
        },
    )
    .unwrap();
    model.generate(request).await.unwrap();
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 1);
    serde_json::from_slice(&requests[0].body).unwrap()
}

#[tokio::test]
async fn chat_sends_every_kind_the_model_reads_and_tool_media_follow_in_a_user_message() {
    let body = sent(
        "openai_chat:gpt-4o",
        Some(InputModalities::ALL),
        &media_request(),
    )
    .await;
    let messages = body["messages"].as_array().unwrap();
    let image = json!({"type": "image_url", "image_url": {"url": data_url("image/png", PNG)}});
    let pdf = json!({"type": "file", "file": {"filename": "document.pdf", "file_data": data_url("application/pdf", PDF)}});
    let audio = json!({"type": "input_audio", "input_audio": {"data": b64(WAV), "format": "wav"}});
    assert_eq!(
        messages[1]["content"],
        json!([{"type": "text", "text": "Compare these."}, image, pdf, audio])
    );
    // Tool messages take text only: each medium leaves a line there and follows in a user
    // message that says which result it came from.
    assert_eq!(messages[3]["role"], "tool");
    assert_eq!(
        messages[3]["content"],
        format!(
            "Fetched.\n[An image (image/png, {} bytes) follows in the next message.]\n[A PDF (application/pdf, {} bytes) follows in the next message.]\n[Audio (audio/wav, {} bytes) follows in the next message.]",
            PNG.len(),
            PDF.len(),
            WAV.len()
        )
    );
    assert_eq!(messages[4]["role"], "user");
    assert_eq!(
        messages[4]["content"],
        json!([{"type": "text", "text": "Attachments of the fetch result (call_1):"}, image, pdf, audio])
    );
    assert_eq!(messages.len(), 5);
}

#[tokio::test]
async fn chat_notes_what_the_profile_refuses_and_audio_the_api_cannot_take_as_is() {
    // GPT-4o reads images and PDFs but not audio.
    let body = sent("openai_chat:gpt-4o", None, &media_request()).await;
    let messages = body["messages"].as_array().unwrap();
    let user = messages[1]["content"].as_array().unwrap();
    assert_eq!(user[1]["type"], "image_url");
    assert_eq!(user[2]["type"], "file");
    assert_eq!(user[3], json!({"type": "text", "text": audio_note()}));
    let tool = messages[3]["content"].as_str().unwrap();
    assert!(tool.ends_with(&format!("\n{}", audio_note())), "{tool}");
    let followup = messages[4]["content"].as_array().unwrap();
    assert_eq!(followup.len(), 3, "{followup:?}");
    assert_eq!(
        (followup[1]["type"].as_str(), followup[2]["type"].as_str()),
        (Some("image_url"), Some("file"))
    );

    // Chat Completions takes WAV and MP3 only; an audio model is told to convert the rest.
    let ogg = request_with(&[ContentBlock::data("audio/ogg", WAV)]);
    let body = sent("openai_chat:gpt-4o-audio-preview", None, &ogg).await;
    assert_eq!(
        body["messages"][1]["content"][1]["text"],
        format!(
            "[Audio (audio/ogg, {} bytes) was omitted: this model takes audio only as WAV or MP3. Convert it to one of those with a tool, or ask for a transcript instead.]",
            WAV.len()
        )
    );
    let mp3 = request_with(&[ContentBlock::data("audio/mpeg", WAV)]);
    let body = sent("openai_chat:gpt-4o-audio-preview", None, &mp3).await;
    assert_eq!(
        body["messages"][1]["content"][1],
        json!({"type": "input_audio", "input_audio": {"data": b64(WAV), "format": "mp3"}})
    );
}

#[tokio::test]
async fn chat_on_a_text_only_open_model_sends_notes_and_no_attachment_message() {
    let body = sent("ollama:qwen3:8b", None, &media_request()).await;
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(
        messages[1]["content"],
        json!([
            {"type": "text", "text": "Compare these."},
            {"type": "text", "text": image_note()},
            {"type": "text", "text": pdf_note()},
            {"type": "text", "text": audio_note()},
        ])
    );
    assert_eq!(
        messages[3]["content"],
        format!(
            "Fetched.\n{}\n{}\n{}",
            image_note(),
            pdf_note(),
            audio_note()
        )
    );
    assert_eq!(messages.len(), 4, "nothing follows the tool message");
}

#[tokio::test]
async fn responses_send_images_and_pdfs_in_messages_and_tool_outputs_and_note_audio() {
    // Even a model that hears audio gets a note: Responses input takes no audio.
    let body = sent(
        "openai:gpt-4o",
        Some(InputModalities::ALL),
        &media_request(),
    )
    .await;
    let input = body["input"].as_array().unwrap();
    let parts = |text: &str| {
        json!([
            {"type": "input_text", "text": text},
            {"type": "input_image", "image_url": data_url("image/png", PNG)},
            {"type": "input_file", "filename": "document.pdf", "file_data": data_url("application/pdf", PDF)},
            {"type": "input_text", "text": audio_note()},
        ])
    };
    assert_eq!(input[0]["content"], parts("Compare these."));
    assert_eq!(input[2]["type"], "function_call_output");
    assert_eq!(input[2]["output"], parts("Fetched."));
}

#[tokio::test]
async fn anthropic_sends_images_and_documents_in_user_turns_and_tool_results_and_notes_audio() {
    let body = sent("anthropic:claude-sonnet-4-5", None, &media_request()).await;
    let messages = body["messages"].as_array().unwrap();
    let blocks = |text: &str| {
        vec![
            json!({"type": "text", "text": text}),
            json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}}),
            json!({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": b64(PDF)}}),
            json!({"type": "text", "text": audio_note()}),
        ]
    };
    assert_eq!(
        messages[0]["content"],
        Value::Array(blocks("Compare these."))
    );
    let result = &messages[2]["content"][0];
    assert_eq!(result["type"], "tool_result");
    assert_eq!(result["content"], Value::Array(blocks("Fetched.")));
}

#[tokio::test]
async fn gemini_sends_images_pdfs_and_audio_inline_in_user_turns_and_beside_tool_responses() {
    let body = sent("google_genai:gemini-2.5-flash", None, &media_request()).await;
    let contents = body["contents"].as_array().unwrap();
    let inline =
        |mime: &str, data: &[u8]| json!({"inlineData": {"mimeType": mime, "data": b64(data)}});
    let media = [
        inline("image/png", PNG),
        inline("application/pdf", PDF),
        inline("audio/wav", WAV),
    ];
    let mut user = vec![json!({"text": "Compare these."})];
    user.extend(media.iter().cloned());
    assert_eq!(contents[0]["parts"], Value::Array(user));
    let mut tool = vec![
        json!({"functionResponse": {"id": "call_1", "name": "fetch", "response": {"result": "Fetched."}}}),
    ];
    tool.extend(media.iter().cloned());
    assert_eq!(contents[2]["parts"], Value::Array(tool));
}

#[tokio::test]
async fn gemini_sends_video_and_text_files_and_notes_formats_and_files_it_cannot_take() {
    let request = request_with(&[
        ContentBlock::data("video/quicktime", b"moov".to_vec()),
        ContentBlock::data("audio/mpeg", b"ID3".to_vec()),
        ContentBlock::data("text/csv; charset=utf-8", b"a,b\n1,2".to_vec()),
        ContentBlock::data("image/svg+xml", b"<svg/>".to_vec()),
        ContentBlock::data("application/zip", b"PK".to_vec()),
    ]);
    let body = sent("google_genai:gemini-2.5-flash", None, &request).await;
    let svg = "[An image (image/svg+xml, 6 bytes) was omitted: this model takes images only as PNG, JPEG, WebP, HEIC or HEIF. Convert it to one of those with a tool, or ask for a description of it instead.]";
    let zip = "[A file (application/zip, 2 bytes) was omitted: this model cannot read application/zip content. Ask for a text version instead, e.g. convert it with a tool.]";
    assert_eq!(
        body["contents"][0]["parts"],
        json!([
            {"text": "Compare these."},
            // Under the names Gemini's documentation lists.
            {"inlineData": {"mimeType": "video/mov", "data": b64(b"moov")}},
            {"inlineData": {"mimeType": "audio/mp3", "data": b64(b"ID3")}},
            // Text goes as text, which every API takes.
            {"text": "a,b\n1,2"},
            {"text": svg},
            {"text": zip},
        ])
    );
    let tool = body["contents"][2]["parts"].as_array().unwrap();
    assert_eq!(
        tool[0]["functionResponse"]["response"]["result"],
        format!("Fetched.\na,b\n1,2\n{svg}\n{zip}")
    );
    assert_eq!(
        tool.len(),
        3,
        "the video and the audio ride along: {tool:?}"
    );
}

#[tokio::test]
async fn a_profile_that_refuses_images_gets_a_note_instead_on_every_wire() {
    let no_images = InputModalities {
        images: false,
        ..InputModalities::ALL
    };
    for spec in [
        "openai_chat:gpt-4o",
        "openai:gpt-4o",
        "anthropic:claude-sonnet-4-5",
        "google_genai:gemini-2.5-flash",
    ] {
        let body = sent(spec, Some(no_images), &media_request())
            .await
            .to_string();
        assert!(!body.contains(&b64(PNG)), "{spec} sent the image: {body}");
        let note = serde_json::to_string(&image_note()).unwrap();
        let note = note.trim_matches('"');
        assert_eq!(
            body.matches(note).count(),
            2,
            "{spec}: one note in the user message, one in the tool result: {body}"
        );
        assert!(body.contains(&b64(PDF)), "{spec} still sends the PDF");
    }
}

#[test]
fn profiles_say_what_each_model_family_reads() {
    let images_and_pdfs = InputModalities::IMAGES_AND_PDFS;
    assert_eq!(modalities_for("openai", "gpt-4o-mini"), images_and_pdfs);
    assert_eq!(modalities_for("openai", "o3-mini"), InputModalities::TEXT);
    assert!(modalities_for("openai_chat", "gpt-4o-audio-preview").audio);
    assert_eq!(
        modalities_for("anthropic", "claude-sonnet-4-5"),
        images_and_pdfs
    );
    assert!(!modalities_for("anthropic", "claude-3-haiku-20240307").pdfs);
    assert_eq!(
        modalities_for("google_genai", "gemini-2.5-pro"),
        InputModalities::ALL
    );
    // Models not listed: what the vendor's own models read, text only on open-model hosts.
    assert_eq!(modalities_for("anthropic", "claude-next"), images_and_pdfs);
    assert_eq!(
        modalities_for("google_genai", "future-model"),
        InputModalities::ALL
    );
    assert_eq!(modalities_for("vllm", "my-finetune"), InputModalities::TEXT);
    assert_eq!(modalities_for("ollama", "qwen3:8b"), InputModalities::TEXT);
    assert!(modalities_for("ollama", "llama3.2-vision:11b").images);
    assert!(modalities_for("vllm", "meta-llama/Llama-3.2-11B-Vision-Instruct").images);
    // OpenRouter turns PDFs into text for any model.
    let llama = modalities_for("openrouter", "meta-llama/llama-3.3-70b-instruct");
    assert!(llama.pdfs && !llama.images);
    assert_eq!(
        modalities_for("openrouter", "anthropic/claude-sonnet-4"),
        images_and_pdfs
    );
}

#[test]
fn a_model_reports_what_it_reads_and_options_override_the_table() {
    let options = ModelOptions {
        api_key: Some(Secret::new(TEST_KEY)),
        ..ModelOptions::default()
    };
    let model = from_spec_with("openai:gpt-4o", &options).unwrap();
    assert_eq!(
        model.input_modalities(),
        Some(InputModalities::IMAGES_AND_PDFS)
    );
    let options = ModelOptions {
        modalities: Some(InputModalities::TEXT),
        ..options
    };
    let model = from_spec_with("openai:gpt-4o", &options).unwrap();
    assert_eq!(model.input_modalities(), Some(InputModalities::TEXT));
}
