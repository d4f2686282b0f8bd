"""{{name}}: a weft node plugin in Python (the `plugin` world of weft:node@0.2.0 in ./wit),
built with componentize-py. One node, `{{class}}` (STRING -> STRING); its logic is in nodes.py."""

import json
from typing import List

import wit_world
from wit_world.imports import host
from wit_world.imports.types import (
    InputSpec,
    NamedValue,
    NodeDef,
    NodeError,
    NodeResult,
    OutputSpec,
    Value_Text,
)
from wit_world.types import Err

from nodes import greet

GREET = NodeDef(
    class_type="{{class}}",
    display_name="Greet ({{name}})",
    category="{{name}}",
    description="Greets someone by name.",
    inputs=[
        InputSpec(
            name="name",
            type_name="STRING",
            required=False,
            default=json.dumps("world"),
            min=None,
            max=None,
            step=None,
            options=[],
            multiline=False,
            tooltip="Who to greet",
            model_folder=None,
        )
    ],
    outputs=[OutputSpec(type_name="STRING", name="STRING", is_list=False, tooltip=None)],
    output_node=False,
    deterministic=True,
)


class WitWorld(wit_world.WitWorld):
    """The plugin: `describe` and `execute` of the `plugin` world."""

    def describe(self) -> List[NodeDef]:
        return [GREET]

    def execute(self, class_type: str, inputs: List[NamedValue]) -> NodeResult:
        if class_type != GREET.class_type:
            raise Err(NodeError(code="unknown_class", message=f"no node class {class_type}"))
        name = "world"
        for given in inputs:
            if given.name == "name":
                if not isinstance(given.value, Value_Text):
                    raise Err(NodeError(code="invalid_input", message="input `name`: expected STRING"))
                name = given.value.value
        host.progress(1, 1, "greeting")
        return NodeResult(outputs=[Value_Text(greet(name))], files=[])
