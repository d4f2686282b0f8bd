//! `HostileLoudProgress` and `HostileLoudError`: guest strings far larger than anything a
//! job should store or serve. `HostileFileName`: an output whose extension and media type
//! the guest chose to harm clients that save or show it. `HostileLogMarkup`: a log line
//! holding markup, for clients that show logs.

use weft_sdk::{NodeError, OutputKind};

/// `mib` MiB of text, in multi-byte characters so a cut inside one shows.
fn huge(mib: i64) -> String {
    "é".repeat(usize::try_from(mib).unwrap_or(1) << 19)
}

weft_sdk::node! {
    /// An output node that reports one progress step whose message is `mib` MiB long and
    /// succeeds, so its message is the job's last.
    pub struct HostileLoudProgress {
        category: "testing/hostile",
        deterministic: false,
        output_node: true,
        inputs {
            mib: i64 = input::int().default(16).min(1).max(1024),
        }
        outputs {}
        fn execute(ctx, inp) {
            ctx.progress(1, 1, huge(inp.mib).as_str());
            Ok(())
        }
    }
}

weft_sdk::node! {
    /// Fails with the node error `loud` whose message is `mib` MiB long.
    pub struct HostileLoudError {
        category: "testing/hostile",
        deterministic: false,
        inputs {
            mib: i64 = input::int().default(16).min(1).max(1024),
        }
        outputs { STRING: String }
        fn execute(_, inp) {
            Err(NodeError::new("loud", huge(inp.mib)))
        }
    }
}

weft_sdk::node! {
    /// Commits a file holding `content` with the guest's own `extension` and
    /// `content_type` (for example `png/../../../etc/x` and `text/html`).
    pub struct HostileFileName {
        category: "testing/hostile",
        deterministic: false,
        output_node: true,
        inputs {
            content: String = input::string().default("<script>alert(1)</script>"),
            extension: String = input::string().default("png/../../../etc/x"),
            content_type: String = input::string().default("text/html"),
        }
        outputs {}
        fn execute(ctx, inp) {
            ctx.save_bytes(
                OutputKind::File,
                "ok".to_string(),
                inp.extension,
                inp.content_type,
                inp.content.into_bytes(),
            );
            Ok(())
        }
    }
}

weft_sdk::node! {
    /// An output node that prints `text` (markup by default) on stdout, into the job's log.
    pub struct HostileLogMarkup {
        category: "testing/hostile",
        deterministic: false,
        output_node: true,
        inputs {
            text: String = input::string().default("<script>document.title='pwned'</script>"),
        }
        outputs {}
        fn execute(_, inp) {
            println!("{}", inp.text);
            Ok(())
        }
    }
}

weft_sdk::export_plugin!(HostileLoudProgress, HostileLoudError, HostileFileName, HostileLogMarkup);
