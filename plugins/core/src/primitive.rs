//! ComfyUI's primitive nodes: a constant value of each basic type.

/// Python's `sys.maxsize` on 64-bit platforms: the range ComfyUI gives primitive numbers.
const MAXSIZE: i64 = i64::MAX;

weft_sdk::node! {
    /// A constant string.
    pub struct PrimitiveString {
        display_name: "String",
        category: "utils/primitive",
        inputs {
            value: String = input::string(),
        }
        outputs { STRING: String }
        fn execute(_, inp) {
            Ok((inp.value,))
        }
    }
}

weft_sdk::node! {
    /// A constant multi-line string.
    pub struct PrimitiveStringMultiline {
        display_name: "String (Multiline)",
        category: "utils/primitive",
        inputs {
            value: String = input::string().multiline(),
        }
        outputs { STRING: String }
        fn execute(_, inp) {
            Ok((inp.value,))
        }
    }
}

weft_sdk::node! {
    /// A constant integer.
    pub struct PrimitiveInt {
        display_name: "Int",
        category: "utils/primitive",
        inputs {
            value: i64 = input::int().min(-MAXSIZE).max(MAXSIZE),
        }
        outputs { INT: i64 }
        fn execute(_, inp) {
            Ok((inp.value,))
        }
    }
}

weft_sdk::node! {
    /// A constant floating-point number.
    pub struct PrimitiveFloat {
        display_name: "Float",
        category: "utils/primitive",
        inputs {
            value: f64 = input::float()
                .min(-(MAXSIZE as f64))
                .max(MAXSIZE as f64)
                .step(0.1),
        }
        outputs { FLOAT: f64 }
        fn execute(_, inp) {
            Ok((inp.value,))
        }
    }
}

weft_sdk::node! {
    /// A constant boolean.
    pub struct PrimitiveBoolean {
        display_name: "Boolean",
        category: "utils/primitive",
        inputs {
            value: bool = input::boolean(),
        }
        outputs { BOOLEAN: bool }
        fn execute(_, inp) {
            Ok((inp.value,))
        }
    }
}
