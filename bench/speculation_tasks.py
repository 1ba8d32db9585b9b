"""The task set of issue 28's speculation benchmark, standard library only, deterministic.

Each task is a list of OpenAI chat requests (without `model`, `max_tokens` or sampling fields):
- `document`: questions about a ~1,500-token document (chapters 1-2 of Pride and Prejudice, from
  fixtures/, public domain), answered by quoting it (task (a)).
- `code`: "rename this variable" / "add this parameter" on 80-line Rust files of this repository as
  of commit CODE_COMMIT, read with `git show` (task (b)).
- `json`: extraction of an order from a generated document into a JSON schema, sent as
  `response_format` (task (c)).
- `story`: free story writing, nothing to look up (task (d)).

`requests(task, n)` returns n requests, cycling through the task's prompts (22 or more of each).
"""
import pathlib
import random
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
# A fixed commit, so that the code task's prompts do not change as the code does.
CODE_COMMIT = "86277a1"
# About 1,500 SmolLM2 tokens: chapter 1 and the start of chapter 2.
DOCUMENT_CHARS = 5300

QUESTIONS = [
    "Who told Mrs. Bennet that Netherfield Park is let?",
    "Who has taken Netherfield Park, according to Mrs. Long?",
    "When did the young man come down to see the place, and how?",
    "With whom did he agree immediately?",
    "When is he to take possession of Netherfield?",
    "What is the young man's name?",
    "Is he married or single, and what is his fortune?",
    "What is Mrs. Bennet thinking of, regarding Mr. Bingley and her daughters?",
    "What does Mr. Bennet ask about Mr. Bingley's design in settling there?",
    "What does Mr. Bennet propose instead of visiting himself?",
    "What does Mrs. Bennet say about her own beauty?",
    "Who are determined to go and visit Mr. Bingley, and why?",
    "What will Mr. Bennet write to Mr. Bingley?",
    "How does Mrs. Bennet compare Lizzy with Jane and Lydia?",
    "What does Mr. Bennet say about all his daughters, and about Lizzy?",
    "What does Mrs. Bennet say about her nerves?",
    "What does Mr. Bennet reply about her nerves?",
    "What does Mr. Bennet promise when there are twenty young men?",
    "How is Mr. Bennet's character described?",
    "How is Mrs. Bennet's mind described?",
    "What was the business of Mrs. Bennet's life, and its solace?",
    "What was Elizabeth doing when her father spoke to her about Mr. Bingley?",
]

STORIES = [
    "a dragon who learns to bake bread", "a robot lost in a forest", "two friends who find a map",
    "a cat who becomes mayor", "a storm at sea", "a clock that runs backwards", "a library at night",
    "the last train home", "a gardener who grows a talking pumpkin", "a lighthouse with no keeper",
    "a girl who can hear colours", "a village where it never rains", "an astronaut's first day home",
    "a lost letter that arrives fifty years late", "a chess game between two old rivals",
    "a bridge that only appears at midnight", "a baker's apprentice and a secret recipe",
    "a fox who wants to be a painter", "a snowman in July", "a ship made of paper",
    "the quietest person in a noisy city", "a door at the bottom of a lake",
]

CODE_FILES = 22
CODE_LINES = 80


def document():
    """Chapter 1 and the start of chapter 2, cut at a paragraph end after DOCUMENT_CHARS."""
    text = (ROOT / "fixtures/pride-and-prejudice-ch1-12.txt").read_text()
    start = text.index("Chapter 1")
    end = text.index("\n\n", start + DOCUMENT_CHARS)
    return text[start:end].strip()


def document_requests():
    doc = document()
    return [{"messages": [{"role": "user", "content":
             f"Here is a document.\n\n{doc}\n\nQuestion: {q}\n"
             "Answer by quoting the document word for word, then say in one sentence what it means."}]}
            for q in QUESTIONS]


def code_windows():
    """CODE_FILES windows of CODE_LINES lines, each starting at a file's first `fn`, from Rust
    source files (not tests) of engine/, router/ and worker/ at CODE_COMMIT, spread evenly over
    the sorted list of files long enough."""
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", CODE_COMMIT],
                           check=True, capture_output=True, text=True).stdout.split()
    names = sorted(n for n in names if n.endswith(".rs") and n.split("/")[0] in ("engine", "router", "worker")
                   and "/src/" in n and "test" not in n)
    windows = []
    for name in names:
        lines = subprocess.run(["git", "-C", str(ROOT), "show", f"{CODE_COMMIT}:{name}"], check=True,
                               capture_output=True, text=True).stdout.splitlines()
        first = next((i for i, l in enumerate(lines) if re.match(r"\s*(pub(\(\w+\))? )?fn \w+", l)), None)
        if first is None or len(lines) - first < CODE_LINES:
            continue
        window = lines[first:first + CODE_LINES]
        if re.findall(r"\blet (?:mut )?([a-z_][a-z0-9_]{2,})\b", "\n".join(window)):
            windows.append((name, "\n".join(window)))
    step = len(windows) / CODE_FILES
    return [windows[int(i * step)] for i in range(CODE_FILES)]


def code_requests():
    out = []
    for i, (name, code) in enumerate(code_windows()):
        if i % 2 == 0:
            lets = re.findall(r"\blet (?:mut )?([a-z_][a-z0-9_]{2,})\b", code)
            var = max(sorted(set(lets)), key=lambda v: len(re.findall(r"\b%s\b" % v, code)))
            ask = f"Rename the variable `{var}` to `{var}_value` everywhere in this code."
        else:
            fn = re.search(r"\bfn (\w+)", code).group(1)
            ask = f"Add a parameter `verbose: bool` to the function `{fn}` and pass `false` wherever it is called."
        out.append({"messages": [{"role": "user", "content":
                    f"Here is part of the Rust file {name}:\n\n```rust\n{code}\n```\n\n{ask} "
                    "Reply with the whole changed code and nothing else."}]})
    return out


FIRST = ["Maria", "John", "Aiko", "Pierre", "Fatima", "Lars", "Chen", "Olga", "Kwame", "Isabel", "Tomás"]
LAST = ["Lopez", "Smith", "Tanaka", "Dubois", "Haddad", "Nilsen", "Wei", "Petrova", "Mensah", "Rossi"]
CITIES = [("Valencia", "Spain"), ("Leeds", "United Kingdom"), ("Osaka", "Japan"), ("Lyon", "France"),
          ("Rabat", "Morocco"), ("Bergen", "Norway"), ("Chengdu", "China"), ("Kazan", "Russia"),
          ("Kumasi", "Ghana"), ("Turin", "Italy")]
PRODUCTS = [("ceramic mug", 12.5), ("teapot", 34.0), ("linen napkin", 6.25), ("oak cutting board", 41.9),
            ("glass carafe", 22.0), ("cast iron pan", 58.75), ("wool blanket", 89.0), ("desk lamp", 45.5)]

ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "integer"},
        "date": {"type": "string"},
        "customer": {"type": "object", "properties": {
            "name": {"type": "string"}, "email": {"type": "string"},
            "city": {"type": "string"}, "country": {"type": "string"}},
            "required": ["name", "email", "city", "country"], "additionalProperties": False},
        "items": {"type": "array", "items": {"type": "object", "properties": {
            "product": {"type": "string"}, "quantity": {"type": "integer"},
            "unit_price": {"type": "number"}},
            "required": ["product", "quantity", "unit_price"], "additionalProperties": False}},
        "delivery": {"type": "string", "enum": ["standard", "express"]},
    },
    "required": ["order_id", "date", "customer", "items", "delivery"],
    "additionalProperties": False,
}


def order_document(rng):
    first, last = rng.choice(FIRST), rng.choice(LAST)
    city, country = rng.choice(CITIES)
    items = rng.sample(PRODUCTS, rng.randint(2, 4))
    lines = [f"{rng.randint(1, 6)} x {p} at {price:.2f} EUR each" for p, price in items]
    order_id = rng.randint(1000, 99999)
    date = f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    delivery = rng.choice(["standard", "express"])
    return (f"Order {order_id} was placed on {date} by {first} {last} ({first.lower()}.{last.lower()}@example.com), "
            f"who lives in {city}, {country}. The customer ordered {'; '.join(lines)}. "
            f"The customer asked for {delivery} delivery and wrote in the comment field that the parcel may be "
            f"left with a neighbour if nobody is at home. Our warehouse in {rng.choice(CITIES)[0]} confirmed that "
            f"every item was in stock on {date}, and the invoice was sent to {first.lower()}.{last.lower()}@example.com "
            f"on the same day. Payment was made by card. The customer has ordered from us {rng.randint(2, 9)} times "
            f"before and has never returned an item.")


def json_requests():
    rng = random.Random(28)
    return [{"messages": [{"role": "user", "content":
             f"Extract the order from this message as JSON.\n\n{order_document(rng)}"}],
             "response_format": {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER_SCHEMA}}}
            for _ in range(22)]


def story_requests():
    return [{"messages": [{"role": "user", "content": f"Write a story about {s}."}]} for s in STORIES]


TASKS = {"document": document_requests, "code": code_requests, "json": json_requests, "story": story_requests}


def requests(task, n):
    """n requests of `task`, cycling through its prompts."""
    base = TASKS[task]()
    return [base[i % len(base)] for i in range(n)]


if __name__ == "__main__":
    for t in TASKS:
        rs = requests(t, 22)
        print(t, len(rs), "chars of the first:", len(rs[0]["messages"][0]["content"]))
