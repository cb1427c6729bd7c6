"""The Claw tools: schemas and implementations over one world-state dict.

Standard library only: this file runs inside the sandbox (under the agent's own Python)
and is imported by the env on the host for the schemas. A tool is a function
`(state, args) -> result`; it raises `ToolFailure` for a refused call (unknown id, ...).
Arguments are validated against the tool's JSON schema (`validate`, a small subset of JSON
Schema: type, properties, required, additionalProperties, enum, items, minimum, maxLength)
before the function runs, so every door gets the same checks.

State layout (seeded by the task; ids are strings, new ids come from a per-collection counter):
    user      {"name", "email", "now"}          the mailbox owner and the world's fixed clock
    mail      {"messages": [{id, from, to, cc, subject, body, date, folder, labels, read}]}
    calendar  {"events":   [{id, title, start, end, attendees, location, description}]}
    drive     {"files":    [{id, path, content, shared_with}]}
    todo      {"items":    [{id, title, done, due, priority, notes}]}
    helpdesk  {"tickets":  [{id, subject, requester, body, status, priority, assignee, comments}]}
    contacts  {"contacts": [{id, name, email, phone, company, notes}]}
    answer    {"text"}                            the final answer, if the task asks for one
"""

from __future__ import annotations

import copy

FOLDERS = ["inbox", "archive", "spam", "trash", "sent"]
PRIORITIES = ["low", "normal", "high", "urgent"]
STATUSES = ["open", "pending", "resolved", "closed"]
MAX_TEXT = 100_000  # characters in any one string argument


class ToolFailure(Exception):
    """A call the tool refuses: the message goes back to the caller as the error."""


def empty_state() -> dict:
    return {"user": {"name": "Alex Doe", "email": "alex@acme.example", "now": "2026-03-02T09:00:00"},
            "mail": {"messages": []}, "calendar": {"events": []}, "drive": {"files": []},
            "todo": {"items": []}, "helpdesk": {"tickets": []}, "contacts": {"contacts": []},
            "answer": {"text": None}}


def seeded_state(seed: dict) -> dict:
    """The empty world with the task's seed laid over it, service by service."""
    state = empty_state()
    for service, value in (seed or {}).items():
        if service not in state or not isinstance(value, dict):
            raise ValueError(f"unknown service in seed: {service!r}")
        state[service].update(copy.deepcopy(value))
    return state


# ---------------------------------------------------------------------------- schema subset
_TYPES = {"string": str, "integer": int, "boolean": bool, "array": list, "object": dict, "number": (int, float)}


def validate(schema: dict, value, where: str = "arguments") -> None:
    """Raise ToolFailure naming the first place where `value` breaks `schema`."""
    kind = schema.get("type")
    if kind:
        py = _TYPES[kind]
        bad_bool = kind in ("integer", "number") and isinstance(value, bool)
        if not isinstance(value, py) or bad_bool:
            raise ToolFailure(f"{where}: expected {kind}, got {type(value).__name__}")
    if "enum" in schema and value not in schema["enum"]:
        raise ToolFailure(f"{where}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, str) and len(value) > schema.get("maxLength", MAX_TEXT):
        raise ToolFailure(f"{where}: longer than {schema.get('maxLength', MAX_TEXT)} characters")
    if "minimum" in schema and isinstance(value, (int, float)) and value < schema["minimum"]:
        raise ToolFailure(f"{where}: below the minimum {schema['minimum']}")
    if kind == "array" and "items" in schema:
        for i, item in enumerate(value):
            validate(schema["items"], item, f"{where}[{i}]")
    if kind == "object":
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                raise ToolFailure(f"{where}: missing required argument {name!r}")
        for name, item in value.items():
            if name not in props:
                if schema.get("additionalProperties", True) is False:
                    raise ToolFailure(f"{where}: unknown argument {name!r}")
                continue
            validate(props[name], item, f"{where}.{name}")


def _obj(required=(), **props) -> dict:
    return {"type": "object", "properties": props, "required": list(required), "additionalProperties": False}


S = {"type": "string"}
SL = {"type": "array", "items": {"type": "string"}}
B = {"type": "boolean"}


def _desc(schema: dict, text: str) -> dict:
    return dict(schema, description=text)


# ---------------------------------------------------------------------------- helpers
def _new_id(items: list, prefix: str) -> str:
    numbers = [int(i["id"][len(prefix):]) for i in items
               if str(i.get("id", "")).startswith(prefix) and str(i["id"])[len(prefix):].isdigit()]
    return f"{prefix}{max(numbers, default=0) + 1}"


def _update(items, args, key, what):
    """Set the fields `args` names (all but the id `key`) on the item of that id."""
    item = _find(items, args[key], what)
    item.update({k: v for k, v in args.items() if k != key})
    return {key: item["id"]}


def _find(items: list, item_id: str, what: str) -> dict:
    for item in items:
        if item.get("id") == item_id:
            return item
    raise ToolFailure(f"no {what} with id {item_id!r}")


def _matches(text: str | None, query: str | None) -> bool:
    return not query or (query.lower() in (text or "").lower())


def _summary(message: dict) -> dict:
    return {k: message.get(k) for k in ("id", "from", "subject", "date", "folder", "labels", "read")}


# ---------------------------------------------------------------------------- mail
def mail_list_messages(state, args):
    folder = args.get("folder", "inbox")
    out = [_summary(m) for m in state["mail"]["messages"]
           if (folder == "all" or m.get("folder") == folder)
           and _matches(f"{m.get('from')} {m.get('subject')} {m.get('body')}", args.get("query"))
           and (not args.get("label") or args["label"] in m.get("labels", []))]
    return {"messages": out, "count": len(out)}


def mail_get_message(state, args):
    message = _find(state["mail"]["messages"], args["message_id"], "message")
    message["read"] = True
    return copy.deepcopy(message)


def mail_send(state, args):
    messages = state["mail"]["messages"]
    if not args["to"]:
        raise ToolFailure("to: at least one recipient is needed")
    message = {"id": _new_id(messages, "m"), "from": state["user"]["email"], "to": list(args["to"]),
               "cc": list(args.get("cc", [])), "subject": args["subject"], "body": args["body"],
               "date": state["user"]["now"], "folder": "sent", "labels": [], "read": True,
               "in_reply_to": args.get("in_reply_to")}
    if message["in_reply_to"] is not None:
        _find(messages, message["in_reply_to"], "message")
    messages.append(message)
    return {"sent": True, "message_id": message["id"]}


def mail_move_message(state, args):
    message = _find(state["mail"]["messages"], args["message_id"], "message")
    if message.get("folder") == "sent":
        raise ToolFailure("sent messages cannot be moved")
    message["folder"] = args["folder"]
    return {"message_id": message["id"], "folder": message["folder"]}


def mail_label_message(state, args):
    message = _find(state["mail"]["messages"], args["message_id"], "message")
    labels = message.setdefault("labels", [])
    for label in args.get("add", []):
        if label not in labels:
            labels.append(label)
    message["labels"] = [label for label in labels if label not in args.get("remove", [])]
    return {"message_id": message["id"], "labels": message["labels"]}


# ---------------------------------------------------------------------------- calendar
def calendar_list_events(state, args):
    out = [e for e in state["calendar"]["events"]
           if (not args.get("date") or str(e.get("start", "")).startswith(args["date"]))
           and _matches(f"{e.get('title')} {e.get('description')}", args.get("query"))]
    return {"events": copy.deepcopy(out), "count": len(out)}


def _check_times(start: str, end: str) -> None:
    if len(start) != 16 or len(end) != 16 or "T" not in start:
        raise ToolFailure("start and end are YYYY-MM-DDTHH:MM")
    if end <= start:
        raise ToolFailure("end must be after start")


def calendar_create_event(state, args):
    _check_times(args["start"], args["end"])
    events = state["calendar"]["events"]
    event = {"id": _new_id(events, "e"), "title": args["title"], "start": args["start"], "end": args["end"],
             "attendees": list(args.get("attendees", [])), "location": args.get("location", ""),
             "description": args.get("description", "")}
    events.append(event)
    return {"event_id": event["id"]}


def calendar_update_event(state, args):
    event = _find(state["calendar"]["events"], args["event_id"], "event")
    changes = {k: v for k, v in args.items() if k != "event_id"}
    _check_times(changes.get("start", event["start"]), changes.get("end", event["end"]))
    event.update(copy.deepcopy(changes))
    return {"event_id": event["id"], "updated": sorted(changes)}


def calendar_delete_event(state, args):
    events = state["calendar"]["events"]
    event = _find(events, args["event_id"], "event")
    events.remove(event)
    return {"deleted": event["id"]}


# ---------------------------------------------------------------------------- drive
def drive_list_files(state, args):
    out = [{"id": f["id"], "path": f["path"], "size": len(f.get("content", "")), "shared_with": f.get("shared_with", [])}
           for f in state["drive"]["files"] if str(f["path"]).startswith(args.get("folder", ""))]
    return {"files": out, "count": len(out)}


def drive_read_file(state, args):
    return copy.deepcopy(_find(state["drive"]["files"], args["file_id"], "file"))


def drive_write_file(state, args):
    files = state["drive"]["files"]
    for f in files:
        if f["path"] == args["path"]:
            f["content"] = args["content"]
            return {"file_id": f["id"], "created": False}
    f = {"id": _new_id(files, "f"), "path": args["path"], "content": args["content"], "shared_with": []}
    files.append(f)
    return {"file_id": f["id"], "created": True}


def drive_delete_file(state, args):
    files = state["drive"]["files"]
    f = _find(files, args["file_id"], "file")
    files.remove(f)
    return {"deleted": f["id"]}


def drive_share_file(state, args):
    f = _find(state["drive"]["files"], args["file_id"], "file")
    shared = f.setdefault("shared_with", [])
    if args["email"] not in shared:
        shared.append(args["email"])
    return {"file_id": f["id"], "shared_with": shared}


# ---------------------------------------------------------------------------- todo
def todo_list(state, args):
    out = [t for t in state["todo"]["items"] if args.get("include_done", True) or not t.get("done")]
    return {"items": copy.deepcopy(out), "count": len(out)}


def todo_add(state, args):
    items = state["todo"]["items"]
    item = {"id": _new_id(items, "t"), "title": args["title"], "done": False, "due": args.get("due"),
            "priority": args.get("priority", "normal"), "notes": args.get("notes", "")}
    items.append(item)
    return {"item_id": item["id"]}


def todo_update(state, args):
    return _update(state["todo"]["items"], args, "item_id", "todo item")


def todo_delete(state, args):
    items = state["todo"]["items"]
    item = _find(items, args["item_id"], "todo item")
    items.remove(item)
    return {"deleted": item["id"]}


# ---------------------------------------------------------------------------- helpdesk
def helpdesk_list_tickets(state, args):
    out = [{k: t.get(k) for k in ("id", "subject", "requester", "status", "priority", "assignee")}
           for t in state["helpdesk"]["tickets"]
           if (not args.get("status") or t.get("status") == args["status"])]
    return {"tickets": out, "count": len(out)}


def helpdesk_get_ticket(state, args):
    return copy.deepcopy(_find(state["helpdesk"]["tickets"], args["ticket_id"], "ticket"))


def helpdesk_update_ticket(state, args):
    return _update(state["helpdesk"]["tickets"], args, "ticket_id", "ticket")


def helpdesk_add_comment(state, args):
    ticket = _find(state["helpdesk"]["tickets"], args["ticket_id"], "ticket")
    ticket.setdefault("comments", []).append({"author": state["user"]["email"], "text": args["text"],
                                              "public": args.get("public", True)})
    return {"ticket_id": ticket["id"], "comments": len(ticket["comments"])}


# ---------------------------------------------------------------------------- contacts
def contacts_search(state, args):
    out = [c for c in state["contacts"]["contacts"]
           if _matches(f"{c.get('name')} {c.get('email')} {c.get('company')}", args["query"])]
    return {"contacts": copy.deepcopy(out), "count": len(out)}


def contacts_add(state, args):
    contacts = state["contacts"]["contacts"]
    if any(c.get("email") == args["email"] for c in contacts):
        raise ToolFailure(f"a contact with email {args['email']!r} exists already")
    contact = {"id": _new_id(contacts, "c"), "name": args["name"], "email": args["email"],
               "phone": args.get("phone", ""), "company": args.get("company", ""), "notes": args.get("notes", "")}
    contacts.append(contact)
    return {"contact_id": contact["id"]}


def contacts_update(state, args):
    return _update(state["contacts"]["contacts"], args, "contact_id", "contact")


# ---------------------------------------------------------------------------- answer
def submit_answer(state, args):
    state["answer"]["text"] = args["text"]
    return {"recorded": True}


# ---------------------------------------------------------------------------- the table
DATE = _desc(S, "YYYY-MM-DDTHH:MM")
TOOLS: dict[str, dict] = {
    "mail_list_messages": {"fn": mail_list_messages, "description": "List messages (summaries) in a mail folder, optionally filtered by a text query or a label.",
                           "parameters": _obj(folder={"type": "string", "enum": FOLDERS + ["all"], "description": "default inbox"},
                                              query=_desc(S, "text to look for in sender, subject and body"), label=S)},
    "mail_get_message": {"fn": mail_get_message, "description": "Read one message in full (marks it read).",
                         "parameters": _obj(["message_id"], message_id=S)},
    "mail_send": {"fn": mail_send, "description": "Send an email from the user's address. in_reply_to: id of the message answered.",
                  "parameters": _obj(["to", "subject", "body"], to=SL, cc=SL, subject=S, body=S, in_reply_to=S)},
    "mail_move_message": {"fn": mail_move_message, "description": "Move a message to another folder (archive, spam, trash, inbox).",
                          "parameters": _obj(["message_id", "folder"], message_id=S,
                                             folder={"type": "string", "enum": ["inbox", "archive", "spam", "trash"]})},
    "mail_label_message": {"fn": mail_label_message, "description": "Add and/or remove labels on a message.",
                           "parameters": _obj(["message_id"], message_id=S, add=SL, remove=SL)},
    "calendar_list_events": {"fn": calendar_list_events, "description": "List calendar events, optionally on one date (YYYY-MM-DD) or matching a query.",
                             "parameters": _obj(date=_desc(S, "YYYY-MM-DD"), query=S)},
    "calendar_create_event": {"fn": calendar_create_event, "description": "Create a calendar event.",
                              "parameters": _obj(["title", "start", "end"], title=S, start=DATE, end=DATE, attendees=SL,
                                                 location=S, description=S)},
    "calendar_update_event": {"fn": calendar_update_event, "description": "Change fields of an event.",
                              "parameters": _obj(["event_id"], event_id=S, title=S, start=DATE, end=DATE, attendees=SL,
                                                 location=S, description=S)},
    "calendar_delete_event": {"fn": calendar_delete_event, "description": "Delete (cancel) an event.",
                              "parameters": _obj(["event_id"], event_id=S)},
    "drive_list_files": {"fn": drive_list_files, "description": "List files in the drive, optionally under a folder prefix such as 'reports/'.",
                         "parameters": _obj(folder=S)},
    "drive_read_file": {"fn": drive_read_file, "description": "Read a file's content.",
                        "parameters": _obj(["file_id"], file_id=S)},
    "drive_write_file": {"fn": drive_write_file, "description": "Create a file at a path, or overwrite the file at that path.",
                         "parameters": _obj(["path", "content"], path=S, content=S)},
    "drive_delete_file": {"fn": drive_delete_file, "description": "Delete a file.",
                          "parameters": _obj(["file_id"], file_id=S)},
    "drive_share_file": {"fn": drive_share_file, "description": "Share a file with someone by email.",
                         "parameters": _obj(["file_id", "email"], file_id=S, email=S)},
    "todo_list": {"fn": todo_list, "description": "List todo items.",
                  "parameters": _obj(include_done=B)},
    "todo_add": {"fn": todo_add, "description": "Add a todo item. due: YYYY-MM-DD.",
                 "parameters": _obj(["title"], title=S, due=S, priority={"type": "string", "enum": PRIORITIES}, notes=S)},
    "todo_update": {"fn": todo_update, "description": "Change a todo item (mark done, rename, reprioritise).",
                    "parameters": _obj(["item_id"], item_id=S, title=S, done=B, due=S,
                                       priority={"type": "string", "enum": PRIORITIES}, notes=S)},
    "todo_delete": {"fn": todo_delete, "description": "Delete a todo item.",
                    "parameters": _obj(["item_id"], item_id=S)},
    "helpdesk_list_tickets": {"fn": helpdesk_list_tickets, "description": "List helpdesk tickets, optionally by status.",
                              "parameters": _obj(status={"type": "string", "enum": STATUSES})},
    "helpdesk_get_ticket": {"fn": helpdesk_get_ticket, "description": "Read a ticket in full, with its comments.",
                            "parameters": _obj(["ticket_id"], ticket_id=S)},
    "helpdesk_update_ticket": {"fn": helpdesk_update_ticket, "description": "Change a ticket's status, priority or assignee.",
                               "parameters": _obj(["ticket_id"], ticket_id=S,
                                                  status={"type": "string", "enum": STATUSES},
                                                  priority={"type": "string", "enum": PRIORITIES}, assignee=S)},
    "helpdesk_add_comment": {"fn": helpdesk_add_comment, "description": "Comment on a ticket (public: visible to the requester).",
                             "parameters": _obj(["ticket_id", "text"], ticket_id=S, text=S, public=B)},
    "contacts_search": {"fn": contacts_search, "description": "Search contacts by name, email or company.",
                        "parameters": _obj(["query"], query=S)},
    "contacts_add": {"fn": contacts_add, "description": "Add a contact.",
                     "parameters": _obj(["name", "email"], name=S, email=S, phone=S, company=S, notes=S)},
    "contacts_update": {"fn": contacts_update, "description": "Change a contact's fields.",
                        "parameters": _obj(["contact_id"], contact_id=S, name=S, email=S, phone=S, company=S, notes=S)},
    "submit_answer": {"fn": submit_answer, "description": "Record your final answer to the user's question (free text).",
                      "parameters": _obj(["text"], text=S)},
}
SERVICES = ["mail", "calendar", "drive", "todo", "helpdesk", "contacts"]


def schema(name: str) -> dict:
    """The OpenAI-style function schema of a tool."""
    tool = TOOLS[name]
    return {"type": "function", "function": {"name": name, "description": tool["description"],
                                             "parameters": copy.deepcopy(tool["parameters"])}}


def run_tool(state: dict, name: str, args) -> dict:
    """Validate and run one call on `state` (changed in place); ToolFailure on refusal."""
    if name not in TOOLS:
        raise ToolFailure(f"unknown tool {name!r}")
    validate(TOOLS[name]["parameters"], args)
    return TOOLS[name]["fn"](state, args)
