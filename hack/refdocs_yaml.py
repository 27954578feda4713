"""The YAML that `memprof crd` writes, read with the standard library only.

CI runs the reference generator before anything is pip-installed, so it
cannot lean on PyYAML. The CRD file is serde_yaml's output, a small subset:
block mappings and sequences (a sequence under a key may sit at the key's
indent), plain and quoted scalars, `|` literals, and the empty flow
collections `[]` and `{}`. Anything else is refused with its line number,
so a change in the emitter fails loudly instead of misreading a field.
"""

import json
import re


class YamlError(ValueError):
    """A line outside the subset; the message names it."""


def load_all(text):
    """Every document of `text`, in order (documents split on `---`)."""
    docs, chunk = [], []
    for line in text.split("\n"):
        if line.rstrip() == "---":
            if any(raw.strip() for raw in chunk):
                docs.append(load(chunk))
            chunk = []
        else:
            chunk.append(line)
    if any(raw.strip() for raw in chunk):
        docs.append(load(chunk))
    return docs


def load(lines):
    """One document from its lines."""
    reader = _Reader(lines)
    i = reader.skip_blank(0)
    value, i = reader.node(i, reader.indent(i))
    if reader.skip_blank(i) < len(reader.lines):
        raise YamlError("line %d: unexpected indentation" % (reader.skip_blank(i) + 1))
    return value


class _Reader:
    def __init__(self, lines):
        self.lines = list(lines)

    def indent(self, i):
        line = self.lines[i]
        return len(line) - len(line.lstrip(" "))

    def text(self, i):
        return self.lines[i].strip()

    def skip_blank(self, i):
        while i < len(self.lines) and not self.lines[i].strip():
            i += 1
        return i

    def is_item(self, i):
        text = self.text(i)
        return text == "-" or text.startswith("- ")

    def node(self, i, indent):
        """The block node starting at line i, at `indent`; (value, next line)."""
        if self.is_item(i):
            return self.sequence(i, indent)
        return self.mapping(i, indent)

    def sequence(self, i, indent):
        items = []
        while i < len(self.lines) and self.indent(i) == indent and self.is_item(i):
            rest = self.text(i)[1:].strip()
            if not rest:
                j = self.skip_blank(i + 1)
                value, i = self.node(j, self.indent(j))
            elif _key_of(rest) is not None:
                # "- key: value" opens a mapping whose keys sit two columns in.
                self.lines[i] = " " * (indent + 2) + rest
                value, i = self.mapping(i, indent + 2)
            else:
                value, i = scalar(rest, i), i + 1
            items.append(value)
            i = self.skip_blank(i)
        return items, i

    def mapping(self, i, indent):
        out = {}
        while i < len(self.lines) and self.indent(i) == indent and not self.is_item(i):
            split = _key_of(self.text(i))
            if split is None:
                raise YamlError("line %d: expected `key: value`, got %r" % (i + 1, self.text(i)))
            key, rest = split
            out[key], i = self.value(i, indent, rest)
            i = self.skip_blank(i)
        if i < len(self.lines) and self.indent(i) > indent:
            raise YamlError("line %d: unexpected indentation" % (i + 1))
        return out, i

    def value(self, i, indent, rest):
        """The value after `key:` on line i; (value, next line)."""
        if rest in ("|", "|-", "|+"):
            return self.literal(i + 1, indent, rest[1:])
        if rest:
            return scalar(rest, i), i + 1
        j = self.skip_blank(i + 1)
        if j < len(self.lines) and (self.indent(j) > indent or (self.indent(j) == indent and self.is_item(j))):
            return self.node(j, self.indent(j))
        return None, i + 1

    def literal(self, i, indent, chomp):
        body = []
        while i < len(self.lines) and (not self.lines[i].strip() or self.indent(i) > indent):
            body.append(self.lines[i])
            i += 1
        while body and not body[-1].strip():
            body.pop()
            i -= 1
        if not body:
            return "", i
        cut = min(len(b) - len(b.lstrip(" ")) for b in body if b.strip())
        text = "\n".join(b[cut:] for b in body)
        return (text if chomp == "-" else text + "\n"), i


_KEY = re.compile(r"^([^\s'\"#][^:]*|'[^']*'|\"[^\"]*\"):(?: (.*)|)$")


def _key_of(text):
    """(key, rest) when `text` is `key: rest` or `key:`; else None."""
    m = _KEY.match(text)
    if not m:
        return None
    key = m.group(1)
    if key[0] in "'\"":
        key = key[1:-1]
    return key, (m.group(2) or "").strip()


def scalar(text, i=0):
    """A scalar as YAML 1.2's core schema reads it."""
    if text.startswith("'"):
        if not text.endswith("'") or len(text) < 2:
            raise YamlError("line %d: unterminated quoted scalar" % (i + 1))
        return text[1:-1].replace("''", "'")
    if text.startswith('"'):
        return json.loads(text)
    if text in ("[]", "{}"):
        return [] if text == "[]" else {}
    if text[0] in "[{&*!|>%@`":
        raise YamlError("line %d: %r is outside the YAML this reader knows" % (i + 1, text))
    return _plain(text)


def _plain(text):
    if text in ("null", "~"):
        return None
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r"[-+]?[0-9]+", text):
        return int(text)
    if re.fullmatch(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?", text):
        return float(text)
    return text
