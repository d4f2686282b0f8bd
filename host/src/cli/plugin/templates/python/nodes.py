"""The logic of {{name}}'s nodes, in plain Python: no bindings, so it is tested without a build."""


def greet(name: str) -> str:
    """What `{{class}}` returns."""
    return f"Hello, {name}!"
