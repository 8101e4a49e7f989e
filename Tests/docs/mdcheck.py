"""Checks of the repository's Markdown: relative links and #anchors that resolve, and `pubsub` command lines whose
flags exist. Parsing is markdown-it-py's (CommonMark, with tables); anchors follow GitHub's rules."""

import os
import re
import subprocess
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from markdown_it import MarkdownIt

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_md = MarkdownIt("commonmark").enable("table")

# Folders that hold no documentation of the repository: build output, dependencies, hidden tool folders.
_SKIP_DIRS = {"node_modules", "vendor"}


def markdown_files(root=REPO):
    """Every Markdown file of the repository, as paths relative to root, sorted."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in _SKIP_DIRS)
        for name in filenames:
            if name.lower().endswith(".md"):
                found.append(os.path.relpath(os.path.join(dirpath, name), root))
    return sorted(found)


def github_slug(text):
    """The anchor GitHub gives a heading whose rendered text is `text` (github-slugger): lower case, every character
    that is not a letter, digit, `_`, `-` or space removed, each space a `-`."""
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def _inline_text(token):
    """The rendered text of an inline token: text, code spans and link texts, without markup."""
    parts = []
    for child in token.children or []:
        if child.type in ("text", "code_inline"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append(" ")
        elif child.type == "image":
            parts.append("".join(c.content for c in child.children or []))
    return "".join(parts)


_HTML_ANCHOR = re.compile(r"""<a\s[^>]*\b(?:name|id)\s*=\s*["']([^"']+)["']""", re.I)
_HTML_LINK = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.I)


@dataclass
class Document:
    path: str                                   # relative to the repository
    anchors: set = field(default_factory=set)
    links: list = field(default_factory=list)   # (line, target)
    code: list = field(default_factory=list)    # (line, text) of code spans and shell code blocks
    lines: int = 0


def parse(path, root=REPO):
    with open(os.path.join(root, path), encoding="utf-8") as f:
        text = f.read()
    doc = Document(path=path, lines=len(text.splitlines()))
    tokens = _md.parse(text)
    occurrences = {}
    for i, token in enumerate(tokens):
        line = token.map[0] + 1 if token.map else 0
        if token.type == "heading_open":
            # a repeated heading gets -1, -2, … as github-slugger numbers them
            base = slug = github_slug(_inline_text(tokens[i + 1]))
            while slug in occurrences:
                occurrences[base] += 1
                slug = f"{base}-{occurrences[base]}"
            occurrences[slug] = 0
            doc.anchors.add(slug)
        elif token.type == "html_block":
            doc.anchors.update(_HTML_ANCHOR.findall(token.content))
            doc.links += [(line, t) for t in _HTML_LINK.findall(token.content)]
        elif token.type in ("fence", "code_block"):
            lang = (token.info or "").split()[0] if token.info else ""
            if lang in ("", "sh", "bash", "shell", "console"):
                # one command per logical line: join backslash continuations
                joined = token.content.replace("\\\n", " ")
                doc.code += [(line, l) for l in joined.splitlines()]
        elif token.type == "inline":
            for child in token.children or []:
                if child.type == "link_open":
                    doc.links.append((line, child.attrGet("href")))
                elif child.type == "image":
                    doc.links.append((line, child.attrGet("src")))
                elif child.type == "code_inline":
                    doc.code.append((line, child.content))
                elif child.type == "html_inline":
                    doc.anchors.update(_HTML_ANCHOR.findall(child.content))
                    doc.links += [(line, t) for t in _HTML_LINK.findall(child.content)]
    return doc


def broken_links(root=REPO, files=None):
    """Every relative link or anchor of the Markdown files that does not resolve, as 'file:line: target: why'."""
    files = markdown_files(root) if files is None else files
    docs = {}

    def doc_of(path):
        if path not in docs:
            docs[path] = parse(path, root)
        return docs[path]

    problems = []
    for path in files:
        doc = doc_of(path)
        for line, target in doc.links:
            where = f"{path}:{line}: {target}"
            if not target:
                problems.append(f"{where}: empty link")
                continue
            parts = urlsplit(target)
            if parts.scheme or parts.netloc:
                continue  # http(s), mailto: not checked (no network)
            ref, anchor = unquote(parts.path), unquote(parts.fragment)
            if ref.startswith("/"):
                resolved = os.path.normpath(ref.lstrip("/"))
            elif ref:
                resolved = os.path.normpath(os.path.join(os.path.dirname(path), ref))
            else:
                resolved = path
            if resolved == ".." or resolved.startswith(".." + os.sep):
                problems.append(f"{where}: points outside the repository")
                continue
            full = os.path.join(root, resolved)
            if not os.path.exists(full):
                problems.append(f"{where}: {resolved} does not exist")
                continue
            if parts.fragment:
                if not resolved.lower().endswith(".md"):
                    problems.append(f"{where}: an anchor into {resolved}, which is not Markdown")
                elif anchor not in doc_of(resolved).anchors:
                    problems.append(f"{where}: no heading or anchor #{anchor} in {resolved}")
    return problems


# --- `pubsub <subcommand> --flag` in code


def _help(binary, words):
    out = subprocess.run([binary, *words, "--help"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"`pubsub {' '.join(words)} --help` failed: {out.stderr.strip()}")
    return out.stdout


def _subcommands(help_text):
    section = help_text.split("SUBCOMMANDS:", 1)
    if len(section) < 2:
        return set()
    return set(re.findall(r"^  ([a-z][a-z0-9-]*)\s", section[1], re.M))


def _flags(help_text):
    flags = set()
    for m in re.finditer(r"^\s+((?:-[a-zA-Z], )?--[a-z0-9-]+(?:, --[a-z0-9-]+)*)", help_text, re.M):
        flags.update(re.findall(r"--[a-z0-9-]+", m.group(1)))
    return flags


# A line of shell is cut into simple commands at pipes, `;`, `&`, `(`, `$(` and backticks, after dropping a shell
# comment; a command is `pubsub` (or a path ending in /pubsub) after an optional prompt, variable assignments and
# a wrapper such as sudo.
_SEPARATORS = re.compile(r"\$\(|[|;&()`]")
_PREFIX = re.compile(r"^(?:\$\s+)?(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(?:(?:sudo|exec|time|nohup|env)\s+)*")


def _commands(text):
    text = re.sub(r"(^|\s)#.*", "", text)
    for segment in _SEPARATORS.split(text):
        words = _PREFIX.sub("", segment.strip()).split()
        if words and (words[0] == "pubsub" or words[0].endswith("/pubsub")):
            yield words[1:]


class CommandChecker:
    """Knows the subcommands and flags of one `pubsub` binary, asking its --help once per subcommand."""

    def __init__(self, binary):
        self.binary = binary
        self._helps = {}

    def help(self, words):
        key = tuple(words)
        if key not in self._helps:
            self._helps[key] = _help(self.binary, list(words))
        return self._helps[key]

    def check(self, text):
        """Problems with every `pubsub …` command in a line of code: an unknown subcommand, or a flag the subcommand
        does not take."""
        problems = []
        for words in _commands(text):
            shown = " ".join(["pubsub", *words])
            path = []
            while words and not words[0].startswith("-") and words[0] in _subcommands(self.help(path)):
                path.append(words.pop(0))
            flags = [w.split("=", 1)[0] for w in words if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", w)]
            if not path:
                if [f for f in flags if f != "--help"]:
                    problems.append(f"`{shown}`: no such subcommand")
                continue
            known = _flags(self.help(path))
            for flag in flags:
                if flag not in known:
                    problems.append(f"`pubsub {' '.join(path)} {flag}`: not in `pubsub {' '.join(path)} --help`")
        return problems
