//! `HostileHugeOutput` and `HostileHugeFile`: absurdly large results.

use weft_sdk::OutputKind;

weft_sdk::node! {
    /// Returns a STRING of `mib` MiB of `x` (512 MiB by default).
    pub struct HostileHugeOutput {
        category: "testing/hostile",
        deterministic: false,
        inputs {
            mib: u32 = input::uint().default(512).min(1).max(4095),
        }
        outputs { STRING: String }
        fn execute(_, inp) {
            let len = usize::try_from(u64::from(inp.mib) << 20)?;
            Ok(("x".repeat(len),))
        }
    }
}

weft_sdk::node! {
    /// Commits a `bytes` file of `mib` MiB (512 MiB by default), kind `file`,
    /// `application/octet-stream`, extension `bin`.
    pub struct HostileHugeFile {
        category: "testing/hostile",
        deterministic: false,
        output_node: true,
        inputs {
            mib: u32 = input::uint().default(512).min(1).max(4095),
            filename_prefix: String = input::string().default("hostile"),
        }
        outputs {}
        fn execute(ctx, inp) {
            let len = usize::try_from(u64::from(inp.mib) << 20)?;
            ctx.save_bytes(
                OutputKind::File,
                inp.filename_prefix,
                "bin",
                "application/octet-stream",
                vec![0x5A; len],
            );
            Ok(())
        }
    }
}

weft_sdk::export_plugin!(HostileHugeOutput, HostileHugeFile);
