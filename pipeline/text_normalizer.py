"""Whisper-style English text normalisation for WER, and a corpus-level ``wer``.

Both sides of a comparison go through the same ``normalize`` so that surface differences do not count
as errors: case, punctuation, bracketed annotations ("[noise]", "(laughs)"), fillers ("um"), titles
("Mr." -> "mister"), contractions ("won't" -> "will not"), and numbers (spelled-out numbers become digits:
"three" -> "3", "twenty-one" -> "21", "one hundred and five" -> "105", "nineteen ninety five" -> "1995",
"twenty first" -> "21st", "two point five" -> "2.5", "5%" -> "5 percent", "$5" -> "5 dollars").

    python -m pipeline.text_normalizer "Mr. Smith paid $3.50 for twenty-one apples."
"""

from __future__ import annotations

import re
import sys
import unicodedata

__all__ = ["normalize", "wer", "word_errors"]

# ----------------------------------------------------------------------------- word-level tables

TITLES = {
    "mr": "mister", "mrs": "missus", "ms": "miss", "dr": "doctor", "prof": "professor", "st": "saint",
    "capt": "captain", "gen": "general", "gov": "governor", "sen": "senator", "rep": "representative",
    "pres": "president", "rev": "reverend", "hon": "honorable", "lt": "lieutenant", "col": "colonel",
    "sgt": "sergeant", "jr": "junior", "sr": "senior", "esq": "esquire", "mt": "mount", "vs": "versus",
    "etc": "et cetera",
}

WHOLE_WORDS = {
    "won't": "will not", "can't": "can not", "cannot": "can not", "shan't": "shall not", "ain't": "aint",
    "let's": "let us", "y'all": "you all", "ma'am": "madam", "o'clock": "oclock",
    "gonna": "going to", "wanna": "want to", "gotta": "got to", "gimme": "give me", "lemme": "let me",
    "ok": "okay", "alright": "all right", "mister": "mister", "percent": "percent", "per cent": "percent",
}

SUFFIXES = [  # applied after WHOLE_WORDS, like Whisper's normaliser (possessive 's also becomes " is")
    (r"n't\b", " not"), (r"'re\b", " are"), (r"'s\b", " is"), (r"'d\b", " would"), (r"'ll\b", " will"),
    (r"'ve\b", " have"), (r"'m\b", " am"),
]

FILLERS = {"uh", "um", "umm", "uhm", "hmm", "hm", "mm", "mmm", "mhm", "er", "erm", "ah"}

BOUNDARY = "\x01"  # stands for removed phrase punctuation while numbers are read

SYMBOLS = {"%": " percent ", "&": " and ", "+": " plus ", "@": " at ", "=": " equals "}
CURRENCIES = {"$": "dollars", "£": "pounds", "€": "euros", "¥": "yen"}

# ----------------------------------------------------------------------------- number words

UNITS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine".split())}
TEENS = {w: i + 10 for i, w in enumerate(
    "ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split())}
TENS = {w: (i + 2) * 10 for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split())}
SCALES = {"thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000, "trillion": 10**12}

ORDINALS = {
    "first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7, "eighth": 8,
    "ninth": 9, "tenth": 10, "eleventh": 11, "twelfth": 12, "thirteenth": 13, "fourteenth": 14,
    "fifteenth": 15, "sixteenth": 16, "seventeenth": 17, "eighteenth": 18, "nineteenth": 19,
    "twentieth": 20, "thirtieth": 30, "fortieth": 40, "fiftieth": 50, "sixtieth": 60, "seventieth": 70,
    "eightieth": 80, "ninetieth": 90, "hundredth": 100, "thousandth": 1000, "millionth": 10**6,
}

NUMBER_WORDS = set(UNITS) | set(TEENS) | set(TENS) | set(SCALES) | {"hundred"} | set(ORDINALS)


def _kind(word: str) -> str:
    if word in UNITS:
        return "unit"
    if word in TEENS:
        return "teen"
    if word in TENS:
        return "tens"
    if word == "hundred":
        return "hundred"
    if word in SCALES:
        return "scale"
    return "ordinal"


def _ordinal_suffix(value: int) -> str:
    if value % 100 in (11, 12, 13):
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(value % 10, "th")


class _Group:
    """One number being read left to right, e.g. "three hundred and twenty one"."""

    def __init__(self) -> None:
        self.total = 0  # completed thousands/millions part
        self.current = 0  # part below the last scale word
        self.last: str | None = None  # kind of the last word taken
        self.last_scale = 10**15
        self.words = 0
        self.ordinal = False
        self.first_kind: str | None = None

    @property
    def value(self) -> int:
        return self.total + self.current

    def accepts(self, word: str) -> bool:
        if self.ordinal:
            return False
        kind = _kind(word)
        if kind == "ordinal":
            value = ORDINALS[word]
            if value < 10:
                kind = "unit"
            elif value < 20:
                kind = "teen"
            elif value < 100:
                kind = "tens"
            elif value == 100:
                kind = "hundred"
            else:
                kind = "scale"
        if kind == "unit":
            return self.last in (None, "tens", "hundred", "scale")
        if kind in ("teen", "tens"):
            return self.last in (None, "hundred", "scale")
        if kind == "hundred":
            return self.last in (None, "unit", "teen", "tens") and self.current < 100
        scale = SCALES.get(word, ORDINALS.get(word, 0))
        return self.last is not None and self.last != "scale" and scale < self.last_scale

    def add(self, word: str) -> None:
        kind = _kind(word)
        self.words += 1
        if kind == "ordinal":
            self.ordinal = True
            value = ORDINALS[word]
            if value >= 1000:
                self._scale(value)
                kind = "scale"
            elif value == 100:
                self.current = (self.current or 1) * 100
                kind = "hundred"
            else:
                self.current += value
                kind = "unit" if value < 10 else "teen" if value < 20 else "tens"
        elif kind in ("unit", "teen", "tens"):
            self.current += UNITS.get(word, TEENS.get(word, TENS.get(word, 0)))
        elif kind == "hundred":
            self.current = (self.current or 1) * 100
        else:
            self._scale(SCALES[word])
        self.first_kind = self.first_kind or kind
        self.last = kind

    def _scale(self, scale: int) -> None:
        self.total += (self.current or 1) * scale
        self.current = 0
        self.last_scale = scale

    def is_two_digit_pair(self) -> bool:
        """True for a spoken 10..99 (e.g. "nineteen", "ninety five"), the halves of a spoken year."""
        return self.total == 0 and 10 <= self.current <= 99 and self.first_kind in ("teen", "tens")

    def text(self) -> str:
        return f"{self.value}{_ordinal_suffix(self.value)}" if self.ordinal else str(self.value)


def _collect_run(words: list[str], start: int) -> tuple[list[_Group | str], int]:
    """Split the number words from ``words[start]`` on into groups; "point" and "oh" stay as markers."""
    items: list[_Group | str] = []
    i = start
    while i < len(words):
        word, nxt = words[i], (words[i + 1] if i + 1 < len(words) else "")
        last = items[-1] if items else None
        if isinstance(last, _Group) and word == "and" and last.last in ("hundred", "scale") \
                and nxt in NUMBER_WORDS and _kind(nxt) != "scale" and nxt != "hundred" and last.accepts(nxt):
            i += 1  # "one hundred and five"
            continue
        if isinstance(last, _Group) and word == "point" and not last.ordinal and nxt in UNITS:
            items.append("point")
        elif isinstance(last, _Group) and word == "oh" and last.is_two_digit_pair() and nxt in UNITS:
            items.append("oh")
        elif word in NUMBER_WORDS:
            if isinstance(last, _Group) and last.accepts(word):
                last.add(word)
            else:
                items.append(_Group())
                items[-1].add(word)  # type: ignore[union-attr]
        else:
            break
        i += 1
    return items, i


def _render_run(items: list[_Group | str]) -> list[str]:
    """Turn groups into digit tokens, joining decimals ("2 point 5") and spoken years ("19 95")."""
    out: list[str] = []
    k = 0
    while k < len(items):
        group = items[k]
        assert isinstance(group, _Group)
        nxt = items[k + 1] if k + 1 < len(items) else None
        if nxt == "point":
            digits = []
            k += 2
            while k < len(items) and isinstance(items[k], _Group) and items[k].words == 1 \
                    and items[k].value < 10 and not items[k].ordinal:  # type: ignore[union-attr]
                digits.append(str(items[k].value))  # type: ignore[union-attr]
                k += 1
            out.append(f"{group.value}.{''.join(digits)}")
            continue
        if nxt == "oh":
            unit = items[k + 2]
            out.append(f"{group.value}0{unit.value}{_ordinal_suffix(unit.value) if unit.ordinal else ''}")
            k += 3
            continue
        if isinstance(nxt, _Group) and group.is_two_digit_pair() and not group.ordinal \
                and nxt.is_two_digit_pair():
            year = group.value * 100 + nxt.value
            out.append(f"{year}{_ordinal_suffix(year) if nxt.ordinal else ''}")
            k += 2
            continue
        out.append(group.text())
        k += 1
    return out


def numbers_to_digits(words: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        starts_number = word in NUMBER_WORDS and not (word in SCALES or word == "hundred")
        # "a hundred", "a thousand" -> 100, 1000
        if word == "a" and i + 1 < len(words) and words[i + 1] in ("hundred", "thousand", "million"):
            starts_number, words = True, words[:i] + ["one"] + words[i + 1:]
        if starts_number:
            items, i = _collect_run(words, i)
            out.extend(_render_run(items))
        else:
            out.append(word)
            i += 1
    return out


# ----------------------------------------------------------------------------- character-level steps


def _strip_accents(text: str) -> str:
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def _standardize_symbols(text: str) -> str:
    text = text.replace("’", "'").replace("‘", "'").replace("`", "'")
    for symbol, word in CURRENCIES.items():  # "$3.50" -> "3.50 dollars"
        text = re.sub(re.escape(symbol) + r"\s*(\d[\d,]*(?:\.\d+)?)", rf"\1 {word}", text)
    for symbol, word in SYMBOLS.items():
        text = text.replace(symbol, word)
    return text


def _expand_titles(text: str) -> str:
    pattern = r"(?<![\w'])(" + "|".join(TITLES) + r")\b\.?(?=\s|$)"
    text = re.sub(pattern, lambda m: TITLES[m.group(1)] + " ", text)
    return text


def _expand_contractions(text: str) -> str:
    for word, replacement in WHOLE_WORDS.items():
        text = re.sub(rf"\b{re.escape(word)}\b", replacement, text)
    for pattern, replacement in SUFFIXES:
        text = re.sub(pattern, replacement, text)
    return text


def _clean_punctuation(text: str) -> str:
    text = re.sub(r"[<\[][^>\]]*[>\]]", " ", text)  # [noise], <unk>
    text = re.sub(r"\([^)]*\)", " ", text)  # (laughs)
    text = re.sub(r"\b((?:[a-z]\.){2,})", lambda m: m.group(1).replace(".", ""), text)  # u.s.a. -> usa
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)  # 1,000 -> 1000
    text = re.sub(r"(?<=\d)\.(?=\d)", "\0", text)  # protect decimal points
    text = re.sub(r"[,;:!?.]+", f" {BOUNDARY} ", text)  # phrase ends: numbers never run across them
    text = re.sub(r"[-‐‑‒–—_/]", " ", text)  # hyphens and dashes separate words
    text = text.replace("'", "")  # remaining apostrophes (o'er, rock'n'roll)
    text = "".join(c if c.isalnum() or c.isspace() or c in "\0" + BOUNDARY else " " for c in text)
    return text.replace("\0", ".")


def normalize(text: str) -> str:
    """Normalise one transcript for WER scoring (see the module docstring)."""
    text = _strip_accents(text.lower())
    text = _standardize_symbols(text)
    text = _expand_titles(text)
    text = _expand_contractions(text)
    text = _clean_punctuation(text)
    text = re.sub(r"(\d)([a-z]+)\b", lambda m: m.group(0) if m.group(2) in ("st", "nd", "rd", "th", "s")
                  else f"{m.group(1)} {m.group(2)}", text)  # 10am -> 10 am, keep 21st / 1990s
    words = [w for w in text.split() if w not in FILLERS]
    return " ".join(w for w in numbers_to_digits(words) if w != BOUNDARY)


# ----------------------------------------------------------------------------- WER


def _edit_distance(ref: list[str], hyp: list[str]) -> int:
    previous = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        current = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (r != h))
        previous = current
    return previous[-1]


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(edit distance in words, reference length) for already-normalised strings."""
    ref, hyp = reference.split(), hypothesis.split()
    return _edit_distance(ref, hyp), len(ref)


def wer(references: list[str], hypotheses: list[str], normalize_text: bool = True) -> float:
    """Corpus-level word error rate: total word edits / total reference words (after ``normalize``)."""
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    if normalize_text:
        references = [normalize(r) for r in references]
        hypotheses = [normalize(h) for h in hypotheses]
    total_words = sum(len(r.split()) for r in references)
    if total_words == 0:
        raise ValueError("references contain no words")
    try:
        import jiwer
    except ImportError:
        jiwer = None
    if jiwer is not None and all(r.strip() for r in references):
        return float(jiwer.wer(list(references), list(hypotheses)))
    edits = sum(word_errors(r, h)[0] for r, h in zip(references, hypotheses))
    return edits / total_words


if __name__ == "__main__":
    for line in sys.argv[1:] or sys.stdin:
        print(normalize(line))
