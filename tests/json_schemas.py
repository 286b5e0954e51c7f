"""20 JSON schemas of the kinds agent frameworks send (nested objects, arrays, enums, required
fields, bounded numbers, patterned strings), each with a finite language: strings and arrays are
bounded, so a constrained answer completes within a few dozen tokens."""

NAME = {"type": "string", "minLength": 1, "maxLength": 12}

SCHEMAS = [
    {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["zip"],
     "additionalProperties": False},
    {"type": "boolean"},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {
        "x": {"type": "number", "minimum": -10, "maximum": 10}, "y": {"type": "number", "minimum": -10, "maximum": 10}},
        "required": ["x", "y"], "additionalProperties": False}}, "required": ["point"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
     "required": ["tags"], "additionalProperties": False},
    {"enum": ["yes", "no", "maybe"]},
    {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
                                      "ok": {"type": "boolean"}}, "required": ["id", "ok"], "additionalProperties": False},
    {"type": "integer", "minimum": 10, "maximum": 99},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"first": NAME, "last": NAME},
                                               "required": ["first", "last"], "additionalProperties": False},
                                      "admin": {"type": "boolean"}}, "required": ["user", "admin"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {"k": NAME, "v": {"type": "integer", "minimum": 0,
                                                                                   "maximum": 999}},
                                "required": ["k", "v"], "additionalProperties": False}, "minItems": 1, "maxItems": 2},
    {"type": "object", "properties": {"status": {"const": "done"}, "code": {"type": "integer", "minimum": 0,
                                                                             "maximum": 5}},
     "required": ["status", "code"], "additionalProperties": False},
    {"type": "string", "pattern": "^[a-z]{3,8}$"},
    {"type": "object", "properties": {"price": {"type": "number", "minimum": 0, "maximum": 1000},
                                      "currency": {"enum": ["USD", "EUR"]}}, "required": ["price", "currency"],
     "additionalProperties": False},
    {"type": "object", "properties": {"matrix": {"type": "array", "maxItems": 2, "items": {
        "type": "array", "maxItems": 2, "items": {"type": "integer", "minimum": 0, "maximum": 9}}}},
     "required": ["matrix"], "additionalProperties": False},
    {"type": "object", "properties": {"email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"}},
     "required": ["email"], "additionalProperties": False},
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"enum": ["none"]}]},
    {"type": "object", "properties": {"name": NAME, "nick": NAME}, "required": ["name"], "additionalProperties": False},
    {"type": "object", "properties": {"steps": {"type": "array", "items": {"enum": ["mix", "bake", "cool"]},
                                                "minItems": 1, "maxItems": 3},
                                      "minutes": {"type": "integer", "minimum": 1, "maximum": 90}},
     "required": ["steps", "minutes"], "additionalProperties": False},
]
