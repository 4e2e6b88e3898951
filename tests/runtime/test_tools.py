"""Tools from plain callables: schemas from hints, Annotated, docstrings; arrays; validation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from pgmemory.errors import InvalidInputError, ToolArgumentsError
from pgmemory.runtime.tools import Tool, as_tools, tool


class OrderLine(TypedDict):
    dish: str
    quantity: int


def place_order(*lines: OrderLine) -> str:
    """Place a food order.

    Args:
        lines: the dishes and how many portions of each.
    """
    return ", ".join(f"{line['dish']} x{line['quantity']}" for line in lines)


def test_variadic_parameter_becomes_an_array() -> None:
    t = tool(place_order, name="PlaceOrder")
    schema = t.parameters
    assert t.name == "PlaceOrder" and t.description == "Place a food order."
    assert schema["required"] == ["lines"]
    lines = schema["properties"]["lines"]
    assert lines["type"] == "array"
    assert lines["description"] == "the dishes and how many portions of each."
    item = schema["$defs"][lines["items"]["$ref"].split("/")[-1]]
    assert item["properties"]["quantity"]["type"] == "integer"


async def test_variadic_call_spreads_the_items() -> None:
    t = tool(place_order, name="PlaceOrder")
    result = await t.invoke(
        {"lines": [{"dish": "番茄炒蛋", "quantity": 1}, {"dish": "清炒菜心", "quantity": 2}]}
    )
    assert result == "番茄炒蛋 x1, 清炒菜心 x2"


class Dish(BaseModel):
    name: str
    spicy: bool = False


@dataclass
class Line:
    dish: str
    quantity: int = 1


async def test_annotated_descriptions_defaults_and_model_items() -> None:
    async def order(
        dishes: Annotated[list[Dish], "dishes to order"],
        lines: list[Line],
        note: Annotated[str, Field(description="free text", max_length=20)] = "",
        mode: Literal["delivery", "pickup"] = "delivery",
    ) -> dict:
        """Order dishes."""
        return {"n": len(dishes), "first": dishes[0], "lines": lines, "mode": mode}

    t = tool(order)
    props = t.parameters["properties"]
    assert props["dishes"]["description"] == "dishes to order"
    assert props["note"]["description"] == "free text" and props["note"]["maxLength"] == 20
    assert props["mode"]["enum"] == ["delivery", "pickup"]
    assert t.parameters["required"] == ["dishes", "lines"]
    result = await t.invoke({"dishes": [{"name": "x"}], "lines": [{"dish": "y"}]})
    # results come back JSON-native: models and dataclasses are dumped
    assert result == {
        "n": 1,
        "first": {"name": "x", "spicy": False},
        "lines": [{"dish": "y", "quantity": 1}],
        "mode": "delivery",
    }


async def test_sphinx_params_and_sync_functions() -> None:
    def add(a: int, b: int = 2) -> int:
        """Add numbers.

        :param a: first addend
        :param b: second addend
        """
        return a + b

    t = tool(add, description="Adds.")
    assert t.description == "Adds."
    assert t.parameters["properties"]["a"]["description"] == "first addend"
    assert await t.invoke({"a": "3"}) == 5  # lax validation of numeric strings


async def test_invalid_arguments_name_the_field() -> None:
    t = tool(place_order, name="PlaceOrder")
    with pytest.raises(ToolArgumentsError, match=r"lines\.0\.quantity"):
        await t.invoke({"lines": [{"dish": "x", "quantity": "many"}]})


def test_decorator_and_errors() -> None:
    @tool(name="GetMenu")
    def get_menu() -> list[str]:
        """Return the menu."""
        return []

    assert isinstance(get_menu, Tool) and get_menu.name == "GetMenu"
    assert get_menu.to_openai()["function"]["parameters"] == {"properties": {}, "type": "object"}
    with pytest.raises(InvalidInputError, match="tool name 'has space'"):
        tool(lambda: 1, name="has space")
    with pytest.raises(InvalidInputError, match="two tools are named 'GetMenu'"):
        as_tools([get_menu, tool(lambda: 1, name="GetMenu")])
    renamed = tool(get_menu, name="Menu")
    assert renamed.name == "Menu" and renamed.fn is get_menu.fn
