//! weft's text output nodes.

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
