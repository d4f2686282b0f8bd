"""A weft node plugin written in Python, built with componentize-py.

It implements the `plugin` world of `wit/weft-node-0.1.0` with two string nodes:
`PyWordCount` (STRING -> INT) and `PyReverse` (STRING -> STRING).

Build (from the repository root):

    componentize-py -d wit/weft-node-0.1.0 -w plugin componentize app \
        -p plugins/python-example -o weft_python_example.wasm

or `scripts/build-wasm.sh python`.
"""

import json
from typing import Callable, Dict, List, Optional

import wit_world
from wit_world.imports import host
from wit_world.imports.types import (
    InputSpec,
    NamedValue,
    NodeDef,
    NodeError,
    NodeResult,
    OutputSpec,
    Value,
    Value_Int,
    Value_Text,
)
from wit_world.types import Err

CATEGORY = "utils/string/python"


def string_input(name: str, multiline: bool = False, default: Optional[str] = None) -> InputSpec:
    """A required STRING input."""
    return InputSpec(
        name=name,
        type_name="STRING",
        required=True,
        default=None if default is None else json.dumps(default),
        min=None,
        max=None,
        step=None,
        options=[],
        multiline=multiline,
        tooltip=None,
    )


def output(type_name: str, name: str) -> OutputSpec:
    """One output."""
    return OutputSpec(type_name=type_name, name=name, is_list=False, tooltip=None)


def node_error(code: str, message: str) -> Err:
    """The exception that makes `execute` return a node error."""
    return Err(NodeError(code=code, message=message))


def text_input(inputs: Dict[str, Value], name: str) -> str:
    """The STRING input `name`, or an `invalid_input` node error."""
    value = inputs.get(name)
    if value is None:
        raise node_error("invalid_input", f"missing required input `{name}`")
    if not isinstance(value, Value_Text):
        raise node_error("invalid_input", f"input `{name}`: expected STRING")
    return value.value


def word_count(inputs: Dict[str, Value]) -> List[Value]:
    host.progress(0, 1, "counting words")
    count = len(text_input(inputs, "text").split())
    host.progress(1, 1, None)
    return [Value_Int(count)]


def reverse(inputs: Dict[str, Value]) -> List[Value]:
    return [Value_Text(text_input(inputs, "text")[::-1])]


NODES: Dict[str, tuple] = {
    "PyWordCount": (
        NodeDef(
            class_type="PyWordCount",
            display_name="Word Count (Python)",
            category=CATEGORY,
            description="Counts the whitespace-separated words of the text.",
            inputs=[string_input("text", multiline=True)],
            outputs=[output("INT", "words")],
            output_node=False,
            deterministic=True,
        ),
        word_count,
    ),
    "PyReverse": (
        NodeDef(
            class_type="PyReverse",
            display_name="Reverse (Python)",
            category=CATEGORY,
            description="Reverses the text, character by character.",
            inputs=[string_input("text", multiline=True)],
            outputs=[output("STRING", "STRING")],
            output_node=False,
            deterministic=True,
        ),
        reverse,
    ),
}


class WitWorld(wit_world.WitWorld):
    """The plugin: `describe` and `execute` of the `plugin` world."""

    def describe(self) -> List[NodeDef]:
        return [definition for definition, _ in NODES.values()]

    def execute(self, class_type: str, inputs: List[NamedValue]) -> NodeResult:
        entry = NODES.get(class_type)
        if entry is None:
            raise node_error("unknown_class", f"this plugin has no node class `{class_type}`")
        run: Callable[[Dict[str, Value]], List[Value]] = entry[1]
        by_name = {named.name: named.value for named in inputs}
        return NodeResult(outputs=run(by_name), files=[])
