//! weft's text output nodes.

use weft_sdk::Value;

weft_sdk::node! {
    /// Saves the text as a `.txt` job output.
    pub struct SaveText {
        display_name: "Save Text",
        category: "utils",
        output_node: true,
        inputs {
            text: String = input::string().multiline().tooltip("The text to save."),
            filename_prefix: String = input::string()
                .default("weft")
                .tooltip("The prefix for the file to save."),
        }
        outputs {}
        fn execute(ctx, inp) {
            ctx.save_text(inp.filename_prefix, inp.text);
            Ok(())
        }
    }
}

weft_sdk::node! {
    /// Writes the text to the plugin's stdout (the server log) and passes it on.
    /// Never cached, so it logs on every run.
    pub struct LogText {
        display_name: "Log Text",
        category: "utils",
        deterministic: false,
        inputs {
            text: String = input::string().multiline(),
        }
        outputs { STRING: String }
        fn execute(_, inp) {
            println!("{}", inp.text);
            Ok((inp.text,))
        }
    }
}

weft_sdk::node! {
    /// Commits any value as a text output: strings as they are, numbers and booleans as
    /// text, other literals as JSON, and host-held values as their type and size.
    pub struct PreviewAny {
        display_name: "Preview Any",
        category: "utils",
        output_node: true,
        inputs {
            source: Value = input::spec().tooltip("The value to show."),
        }
        outputs {}
        fn execute(ctx, inp) {
            ctx.save_text("preview".to_string(), describe_value(&inp.source));
            Ok(())
        }
    }
}

/// Text for any value.
fn describe_value(value: &Value) -> String {
    match value {
        Value::Int(i) => i.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Boolean(b) => b.to_string(),
        Value::Text(s) => s.clone(),
        Value::Json(j) => j.clone(),
        Value::Asset(a) => format!("asset {}", a.id),
        Value::Image(i) => format!("IMAGE {}x{}x{}", i.batch_size(), i.width(), i.height()),
        Value::Latent(l) => format!("LATENT {}x{}x{}", l.batch_size(), l.width(), l.height()),
        Value::Mask(m) => format!("MASK {}x{}x{}", m.batch_size(), m.width(), m.height()),
        Value::Audio(a) => format!("AUDIO {} frames at {} Hz", a.frames(), a.sample_rate()),
        Value::Handle(h) => format!("{} {}", h.type_name(), h.describe()),
    }
}
