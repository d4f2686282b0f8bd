//! `node!` and `export_plugin!`.

/// Declares a node class: its definition and its code in one place.
///
/// ```ignore
/// weft_sdk::node! {
///     /// Doc comment: becomes the node's description.
///     pub struct StringLength {
///         display_name: "Length",        // optional keys, any order:
///         category: "utils/string",      // display_name, category, description,
///         // output_node: true,          // class_type, output_node, deterministic
///         // deterministic: false,
///         inputs {
///             string: String = input::string().multiline(),
///             // `name: Type` alone uses the type's plain spec.
///         }
///         outputs { length: i64 }
///         fn execute(ctx, inp) {
///             Ok((inp.string.chars().count() as i64,))
///         }
///     }
/// }
/// ```
///
/// * The struct name is the class name (`class_type:` overrides it).
/// * Each input is `name: Type = spec`, where `Type` is an [`InputType`](crate::InputType)
///   (`String`, `i64`, `u32`, `f64`, `bool`, `AssetRef`, `Image`, `Mask`, ...) or an
///   `Option` of one, and `spec` is a [`Spec`](crate::Spec) from [`input`](crate::input)
///   (`input` is in scope inside the macro's spec expressions).
/// * Each output is `name: Type`, where `Type` is an [`OutputType`](crate::OutputType).
/// * `execute` gets `ctx: &mut Context` and `inp`, a struct with one field per input,
///   and returns `Result<(outputs...,), NodeError>` (a tuple in output order, `()` for
///   none). Either argument may be `_`.
#[macro_export]
macro_rules! node {
    (
        $(#[doc = $doc:literal])*
        $vis:vis struct $name:ident { $($body:tt)* }
    ) => {
        $crate::__node_parse! {
            [$($doc)*] [$vis] [$name] [] $($body)*
        }
    };
}

/// Parses the body of [`node!`]: `key: value,` pairs, then `inputs`, `outputs`, `fn execute`.
#[doc(hidden)]
#[macro_export]
macro_rules! __node_parse {
    (
        [$($doc:literal)*] [$vis:vis] [$name:ident] [$($meta:tt)*]
        inputs { $($inputs:tt)* }
        outputs { $($outputs:tt)* }
        fn execute($ctx:tt, $inp:tt) $body:block
        $(;)?
    ) => {
        $crate::__node_impl! {
            [$($doc)*] [$vis] [$name] [$($meta)*] [$($inputs)*] [$($outputs)*] [$ctx] [$inp] $body
        }
    };
    (
        [$($doc:literal)*] [$vis:vis] [$name:ident] [$($meta:tt)*]
        $key:ident : $val:expr , $($rest:tt)*
    ) => {
        $crate::__node_parse! {
            [$($doc)*] [$vis] [$name] [$($meta)* ($key: $val)] $($rest)*
        }
    };
}

/// Expands a parsed [`node!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __node_impl {
    (
        [$($doc:literal)*] [$vis:vis] [$name:ident] [$(($key:ident : $val:expr))*]
        [$($iname:ident : $ity:ty $(= $ispec:expr)?),* $(,)?]
        [$($oname:ident : $oty:ty),* $(,)?]
        [$ctx:tt] [$inp:tt] $body:block
    ) => {
        $(#[doc = $doc])*
        #[derive(Debug, Clone, Copy, Default)]
        $vis struct $name;

        impl $crate::Node for $name {
            fn class_type() -> ::std::borrow::Cow<'static, str> {
                #[allow(unused_mut)]
                let mut class_type = ::std::borrow::Cow::Borrowed(stringify!($name));
                $($crate::__node_class_type!(class_type, $key, $val);)*
                class_type
            }

            fn definition() -> $crate::NodeDef {
                #[allow(unused_imports)]
                use $crate::input;
                let mut def = $crate::NodeDef {
                    class_type: ::std::string::String::from(stringify!($name)),
                    display_name: ::std::string::String::from(stringify!($name)),
                    category: ::std::string::String::new(),
                    description: $crate::__private::doc_text(&[$($doc),*]),
                    inputs: ::std::vec![$(
                        $crate::__private::input_spec::<$ity>(
                            $crate::__private::input_name(stringify!($iname)),
                            $crate::__spec!($ity $(, $ispec)?),
                        )
                    ),*],
                    outputs: ::std::vec![$(
                        $crate::__private::output_spec::<$oty>(stringify!($oname))
                    ),*],
                    output_node: false,
                    deterministic: true,
                };
                $($crate::__node_key!(def, $key, $val);)*
                def
            }

            fn run(
                ctx: &mut $crate::Context,
                #[allow(unused_mut, unused_variables)] mut inputs: $crate::InputValues,
            ) -> ::std::result::Result<::std::vec::Vec<$crate::Value>, $crate::NodeError> {
                #[allow(unused_imports)]
                use $crate::input;

                #[allow(dead_code, non_camel_case_types)]
                struct Inputs {
                    $($iname: $ity,)*
                }

                #[allow(unused_variables, non_snake_case, clippy::needless_return)]
                fn execute(
                    $ctx: &mut $crate::Context,
                    $inp: Inputs,
                ) -> ::std::result::Result<($($oty,)*), $crate::NodeError> $body

                let args = Inputs {
                    $($iname: $crate::__private::take_input::<$ity>(
                        &mut inputs,
                        $crate::__private::input_name(stringify!($iname)),
                        $crate::__spec!($ity $(, $ispec)?),
                    )?,)*
                };
                let outputs = execute(ctx, args)?;
                ::std::result::Result::Ok($crate::IntoOutputs::into_outputs(outputs))
            }
        }
    };
}

/// The spec of an input: the given expression, or the type's plain spec.
#[doc(hidden)]
#[macro_export]
macro_rules! __spec {
    ($ity:ty) => {
        $crate::input::spec::<<$ity as $crate::Input>::Base>()
    };
    ($ity:ty, $spec:expr) => {{
        let spec: $crate::Spec<<$ity as $crate::Input>::Base> = $spec;
        spec
    }};
}

/// Takes the `class_type` key of [`node!`], if it is given, as the class name.
#[doc(hidden)]
#[macro_export]
macro_rules! __node_class_type {
    ($name:ident, class_type, $v:expr) => {
        $name = ::std::borrow::Cow::from($v);
    };
    ($name:ident, $other:ident, $v:expr) => {};
}

/// Applies one `key: value` of [`node!`] to the definition.
#[doc(hidden)]
#[macro_export]
macro_rules! __node_key {
    ($def:ident, class_type, $v:expr) => {
        $def.class_type = ::std::string::String::from($v);
    };
    ($def:ident, display_name, $v:expr) => {
        $def.display_name = ::std::string::String::from($v);
    };
    ($def:ident, category, $v:expr) => {
        $def.category = ::std::string::String::from($v);
    };
    ($def:ident, description, $v:expr) => {
        $def.description = ::std::string::String::from($v);
    };
    ($def:ident, output_node, $v:expr) => {
        $def.output_node = $v;
    };
    ($def:ident, deterministic, $v:expr) => {
        $def.deterministic = $v;
    };
    ($def:ident, $other:ident, $v:expr) => {
        ::std::compile_error!(::std::concat!(
            "unknown node! key `",
            ::std::stringify!($other),
            "` (expected class_type, display_name, category, description, output_node or deterministic)"
        ));
    };
}

/// Exports the listed node classes as the plugin: generates `describe()` and an
/// `execute()` that dispatches by class name (code `unknown_class` otherwise).
///
/// Use it once, in the crate root of a `cdylib` built for `wasm32-wasip2`:
/// `weft_sdk::export_plugin!(StringConcatenate, StringLength);`
#[macro_export]
macro_rules! export_plugin {
    ($($node:ty),+ $(,)?) => {
        /// The plugin's table of node classes.
        #[doc(hidden)]
        pub const __WEFT_NODES: &[$crate::NodeEntry] = &[$($crate::NodeEntry::of::<$node>()),+];

        /// The plugin: implements the `plugin` world.
        #[doc(hidden)]
        pub struct __WeftPlugin;

        impl $crate::bindings::Guest for __WeftPlugin {
            fn describe() -> ::std::vec::Vec<$crate::NodeDef> {
                $crate::describe(__WEFT_NODES)
            }

            fn execute(
                class_type: ::std::string::String,
                inputs: ::std::vec::Vec<$crate::NamedValue>,
            ) -> ::std::result::Result<$crate::NodeResult, $crate::NodeError> {
                $crate::execute(__WEFT_NODES, &class_type, inputs)
            }
        }

        $crate::bindings::__export_plugin_world!(__WeftPlugin with_types_in $crate::bindings);
    };
}
