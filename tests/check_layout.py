#!/usr/bin/python3
"""The core's layout, checked on the source tree:
  - no file in src/, include/ or launcher/ is over 600 lines;
  - no function in a .cpp or .h there is over 60 lines, counted from the
    first line of its signature to its closing brace (lambdas and local
    classes count toward the function that holds them);
  - no function in src/ or launcher/ of three lines or fewer is used from
    one place only, in its own file (a split that only forwards: fold it
    into its caller). Public API, overrides, constructors, operators and
    c10d_compat.h's shims (each names a version difference) aside; a use
    from another file is an interface between files, not a split;
  - every folder of src/ and include/ddp/ has its line in that tree's README.md;
  - every header starts with a comment that says what it is for.
Usage: check_layout.py SOURCE_DIR. Prints each problem; exit 1 if any."""
import bisect
import os
import re
import sys

MAX_LINES = 600
MAX_FUNCTION_LINES = 60


def blank_out(text):
    """The code alone: comments, preprocessor lines and the insides of string
    and character literals become spaces, newlines kept, so that every brace
    left is a brace of the code and every offset keeps its line."""
    out = list(text)
    n = len(text)
    i = 0
    line_start = True  # only whitespace since the last newline

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if c == "\n":
            line_start = True
            i += 1
            continue
        if line_start and c == "#":
            # A directive, with its continuation lines; comments in it end it
            # no later than they would end the line.
            j = i
            while j < n and text[j] != "\n":
                if text.startswith("/*", j):
                    end = text.find("*/", j + 2)
                    j = n if end < 0 else end + 2
                    continue
                if text.startswith("//", j):
                    break
                if text[j] == "\\" and j + 1 < n and text[j + 1] == "\n":
                    j += 2
                    continue
                j += 1
            blank(i, j)
            i = j
            continue
        if not c.isspace():
            line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
        elif c == '"' and i > 0 and text[i - 1] == "R" and re.search(r"(?:^|[^\w])(?:u8|u|U|L)?R$", text[max(0, i - 4):i]):
            m = re.compile(r'"([^()\\\s]{0,16})\(').match(text, i)
            end = text.find(")" + m.group(1) + '"', m.end()) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            blank(i + 1, j - 1)
            i = j
        elif c == '"' or (c == "'" and not in_number(text, i)):
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, min(j, n))
            i = j + 1
        else:
            i += 1
    return "".join(out)


def in_number(text, i):
    """Whether the quote at i is a digit separator (1'000'000)."""
    j = i
    while j > 0 and (text[j - 1].isalnum() or text[j - 1] in "_.'"):
        j -= 1
    return j < i and text[j].isdigit()


def paren_depth(s):
    depth = 0
    for c in s:
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
    return depth


def top_level(s):
    """s with what parentheses and angle brackets hold left out: only what a
    declaration says at its own level. `operator` and its symbol become one
    word first, so that operator< or operator() opens nothing."""
    s = re.sub(r"\boperator\s*(\(\s*\)|\[\s*\]|->\*?|[^\w\s(]+)", "operator_", s)
    out = []
    parens = angles = 0
    for k, c in enumerate(s):
        if c == "(":
            parens += 1
        elif c == ")":
            parens -= 1
            if parens == 0 and angles == 0:
                out.append("()")
            continue
        elif parens == 0 and c == "<" and not s.startswith("<<", k) and s[k - 1:k] != "<":
            angles += 1
        elif parens == 0 and c == ">" and angles > 0 and s[k - 1:k] != "-":
            angles -= 1
            continue
        if parens == 0 and angles == 0:
            out.append(c)
    return "".join(out)


def without_template_prefix(s):
    """s without a leading `template <...>` (or several), attributes and
    access labels."""
    s = re.sub(r"\b(public|private|protected)\s*:(?!:)", " ", s).strip()
    while True:
        m = re.match(r"template\s*<", s)
        if m:
            depth, k = 1, m.end()
            while k < len(s) and depth:
                depth += {"<": 1, ">": -1}.get(s[k], 0)
                k += 1
            s = s[k:].strip()
            continue
        m = re.match(r"\[\[.*?\]\]\s*", s, re.S)
        if m:
            s = s[m.end():]
            continue
        return s


def classify(head):
    """What the brace that follows `head` opens, at the level of namespaces
    and class bodies: 'scope' (namespace, class, extern "C": declarations go
    on inside), 'inline' (a braced value inside the head: a default argument,
    a member's brace-initializer; the head goes on after it), 'function' (a
    function's body), or 'other' (an enum's list, a variable's initializer)."""
    if paren_depth(head) > 0:
        return "inline"
    h = without_template_prefix(head)
    if re.match(r'(inline\s+)?namespace\b|extern\s*"', h):
        return "scope"
    if re.match(r"(typedef\s+)?(class|struct|union)\b", h):
        return "scope"
    if re.match(r"(typedef\s+)?enum\b", h):
        return "other"
    top = top_level(h)
    if re.search(r"(?<![=!<>+\-*/%&|^])=(?!=)", top):
        return "other"  # an initializer: ... = {...}
    m = re.search(r"\(\)", top)
    if not m:
        return "other"  # Type name{...}
    after = top[m.end():]
    if re.match(r"\s*(noexcept\s*(\(\))?\s*)?:(?!:)", after):
        # A constructor's initializer list: a brace right after a member's
        # name is that member's value; any other opens the body.
        return "inline" if re.search(r"[\w>]\s*$", head) else "function"
    last = top.rfind("()")
    rest = top[last + 2:]
    if re.fullmatch(r"\s*((const|volatile|noexcept|override|final|&&?|try)\b\s*|&&?\s*)*(->.*)?", rest, re.S):
        return "function"
    return "other"


def function_name(head):
    h = without_template_prefix(head)
    m = re.search(r"((?:[\w~]+\s*::\s*)*operator\s*(\(\s*\)|\[\s*\]|[^\w\s(]+|\s[\w:\s*&<>]+?))\s*\(", h)
    if m:
        return re.sub(r"\s+", "", m.group(1)) if "operator " not in m.group(1) else re.sub(r"\s+", " ", m.group(1))
    # The first name followed by its parameters at the top level, not a
    # decltype(...) or the like in the return type.
    parens = angles = 0
    for k, c in enumerate(h):
        if c == "(":
            before = h[:k].rstrip()
            word = re.search(r"((?:[\w~]+\s*::\s*)*~?\w+)$", before)
            if parens == 0 and angles == 0 and word and word.group(1) not in (
                    "decltype", "alignas", "__attribute__", "__declspec", "noexcept"):
                return re.sub(r"\s+", "", word.group(1))
            parens += 1
        elif c == ")":
            parens -= 1
        elif parens == 0 and c == "<":
            angles += 1
        elif parens == 0 and c == ">" and angles > 0 and h[k - 1:k] != "-":
            angles -= 1
    return "?"


def matching_brace(code, i):
    """The offset of the brace that closes the one at i, or -1."""
    depth = 0
    for k in range(i, len(code)):
        if code[k] == "{":
            depth += 1
        elif code[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return -1


def functions(text):
    """(name, first line, last line) of every function defined in `text`, a
    C++ file; or raises ValueError where its braces do not match."""
    code = blank_out(text)
    newlines = [k for k, c in enumerate(code) if c == "\n"]

    def line(offset):
        return bisect.bisect_left(newlines, offset) + 1

    found = []
    scopes = 0
    head_start = 0
    i = 0
    while i < len(code):
        c = code[i]
        if c == ";":
            head_start = i + 1
        elif c == "}":
            if scopes == 0:
                raise ValueError(f"line {line(i)}: a closing brace that closes nothing")
            scopes -= 1
            head_start = i + 1
        elif c == "{":
            head = code[head_start:i]
            kind = classify(head)
            if kind == "scope":
                scopes += 1
                head_start = i + 1
            else:
                end = matching_brace(code, i)
                if end < 0:
                    raise ValueError(f"line {line(i)}: a brace that nothing closes")
                if kind == "function":
                    first = head_start + len(head) - len(head.lstrip())
                    found.append((function_name(head), line(first), line(end), head))
                if kind != "inline":
                    head_start = end + 1
                i = end
        i += 1
    if scopes:
        raise ValueError("a namespace or class that nothing closes")
    return found


MAX_TINY_LINES = 3
# Words after which a name followed by ( is a call, not a declaration.
CALL_KEYWORDS = {"return", "throw", "else", "case", "co_return", "co_await", "new", "delete", "do", "not", "and", "or"}


def uses_of(name, code):
    """How many times `name` is used in `code` (blanked C++): called, or
    named as a value; a declaration or definition (a type or a qualifier
    chain's type before it) does not count."""
    count = 0
    for m in re.finditer(r"(?<![\w~])" + re.escape(name) + r"\b", code):
        before = re.sub(r"(?:\w+\s*::\s*)+$", "", code[max(0, m.start() - 200):m.start()].rstrip()).rstrip()
        if before.endswith(("::", "~")):
            continue
        word = re.search(r"(\w+)$", before)
        if word and word.group(1) not in CALL_KEYWORDS:
            continue  # Type name(...): a declaration or definition
        if re.search(r"[\w>][*&]$|\w\s*[*&]$|>$", before) and not before.endswith(("->", ">>")):
            continue  # Type* name(...), std::vector<T> name(...)
        count += 1
    return count


def tiny_single_use(root, found_by_file, blanked):
    """Functions of src/ and launcher/ of MAX_TINY_LINES or fewer used once,
    from their own file."""
    public = set(re.findall(r"\w+", "".join(blanked[p] for p in found_by_file
                                              if os.path.relpath(p, root).startswith("include"))))
    words = {}
    for text in blanked.values():
        for w in re.findall(r"\w+", text):
            words[w] = words.get(w, 0) + 1
    problems = []
    for p, found in found_by_file.items():
        rel = os.path.relpath(p, root)
        if not rel.startswith(("src" + os.sep, "launcher" + os.sep)) or rel.endswith("c10d_compat.h"):
            continue
        defined = {}
        for name, _, _, _ in found:
            defined[name] = defined.get(name, 0) + 1
        for name, first, last, head in found:
            bare = name.split("::")[-1]
            parts = name.split("::")
            if defined[name] > 1:
                continue  # alternatives under #if, or overloads
            if last - first + 1 > MAX_TINY_LINES or not re.fullmatch(r"\w+", bare) or bare == "main":
                continue
            if (len(parts) > 1 and parts[-2] == bare) or re.search(r"\b(class|struct)\s+" + bare + r"\b", blanked[p]):
                continue  # a constructor
            if re.search(r"\b(override|virtual|final)\b", head) or bare in public:
                continue
            # A name written more than four times (definition, perhaps a
            # declaration, a use) has uses enough; the others are read closely.
            if words.get(bare, 0) > 4:
                continue
            uses = {q: uses_of(bare, text) for q, text in blanked.items() if bare in text}
            if sum(uses.values()) == 1 and uses.get(p) == 1:
                problems.append(f"{rel}:{first}: function {name} is {last - first + 1} line(s) and used from one "
                                f"place: fold it into its caller")
    return problems


def main():
    root = sys.argv[1]
    problems = []

    def files_under(*tops):
        for top in tops:
            for d, _, names in os.walk(os.path.join(root, top)):
                for n in sorted(names):
                    yield os.path.join(d, n)

    code = [p for p in files_under("src", "include", "launcher") if p.endswith((".h", ".cpp"))]
    found = {}  # each file's functions, for the checks below
    for p in code:
        with open(p, encoding="utf-8") as f:
            text = f.read()
        lines = text.splitlines()
        rel = os.path.relpath(p, root)
        if len(lines) > MAX_LINES:
            problems.append(f"{rel}: {len(lines)} lines, over {MAX_LINES}: split it by what owns which state")
        if p.endswith(".h") and not (lines and lines[0].startswith("//")):
            problems.append(f"{rel}: a header starts with a comment saying what it is for")
        try:
            found[p] = functions(text)
            for name, first, last, _ in found[p]:
                if last - first + 1 > MAX_FUNCTION_LINES:
                    problems.append(f"{rel}:{first}: function {name} is {last - first + 1} lines, "
                                    f"over {MAX_FUNCTION_LINES}: split it into named steps")
        except ValueError as e:
            problems.append(f"{rel}: cannot measure its functions: {e}")

    blanked = {}
    for top in ("src", "include", "launcher", "tests", "examples", "bench", "fuzz"):
        for p in files_under(top):
            if p.endswith((".h", ".cpp", ".cc", ".cu")):
                blanked[p] = blank_out(open(p, encoding="utf-8", errors="replace").read()) + "\n"
    problems += tiny_single_use(root, found, blanked)

    for tree in ("src", "include/ddp"):
        readme = os.path.join(root, tree, "README.md")
        text = open(readme, encoding="utf-8").read() if os.path.exists(readme) else ""
        for d, subdirs, _ in os.walk(os.path.join(root, tree)):
            for s in subdirs:
                rel = os.path.relpath(os.path.join(d, s), os.path.join(root, tree))
                if f"`{rel}/`" not in text:
                    problems.append(f"{tree}/README.md: no line for the folder `{rel}/`")

    for p in problems:
        print(p)
    print(f"layout: {len(code)} source files, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
