"""Documents lowered to text: UTF-8 text files as they are, PDFs through pypdf."""

from __future__ import annotations

import io
import mimetypes
import posixpath

from respd.protocol.errors import APIError
from respd.service.media.errors import bad
from respd.service.media.values import GENERIC_TYPES, FileText

# Documents read as text: text/* plus these types and extensions.
TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/ld+json",
        "application/x-ndjson",
        "application/xml",
        "application/yaml",
        "application/x-yaml",
        "application/toml",
        "application/javascript",
        "application/x-javascript",
        "application/typescript",
        "application/x-sh",
        "application/x-shellscript",
        "application/x-python",
        "application/x-python-code",
        "application/sql",
        "application/x-tex",
        "application/x-latex",
        "application/csv",
        "application/x-httpd-php",
        "application/graphql",
    }
)
TEXT_EXTENSIONS = frozenset(
    [
        ".txt",
        ".text",
        ".md",
        ".markdown",
        ".rst",
        ".adoc",
        ".org",
        ".tex",
        ".json",
        ".jsonl",
        ".ndjson",
        ".csv",
        ".tsv",
        ".xml",
        ".yaml",
        ".yml",
        ".toml",
        ".ini",
        ".cfg",
        ".conf",
        ".env",
        ".log",
        ".html",
        ".htm",
        ".css",
        ".scss",
        ".js",
        ".mjs",
        ".cjs",
        ".ts",
        ".tsx",
        ".jsx",
        ".py",
        ".pyi",
        ".rb",
        ".php",
        ".pl",
        ".sh",
        ".bash",
        ".zsh",
        ".fish",
        ".ps1",
        ".bat",
        ".c",
        ".h",
        ".cc",
        ".cpp",
        ".cxx",
        ".hpp",
        ".hh",
        ".cs",
        ".java",
        ".kt",
        ".kts",
        ".scala",
        ".go",
        ".rs",
        ".swift",
        ".m",
        ".mm",
        ".r",
        ".jl",
        ".lua",
        ".dart",
        ".ex",
        ".exs",
        ".erl",
        ".hs",
        ".ml",
        ".fs",
        ".clj",
        ".sql",
        ".graphql",
        ".proto",
        ".vue",
        ".svelte",
        ".dockerfile",
        ".makefile",
        ".cmake",
        ".gradle",
        ".patch",
        ".diff",
        ".svg",
    ]
)
PDF_TYPE = "application/pdf"


def document_kind(mime: str, filename: str, data: bytes) -> str | None:
    """'pdf', 'text', or None (unsupported) from the declared type, the name and the bytes."""
    mime = mime.split(";")[0].strip().lower()
    ext = posixpath.splitext(filename.lower())[1] or (
        "." + filename.lower() if filename.lower() in ("dockerfile", "makefile") else ""
    )
    if mime in GENERIC_TYPES:
        if ext == ".pdf" or data.startswith(b"%PDF-"):
            return "pdf"
        if ext in TEXT_EXTENSIONS:
            return "text"
        guessed = mimetypes.guess_type(filename)[0] or ""
        if guessed.startswith("text/") or guessed in TEXT_TYPES:
            return "text"
        return None
    if mime == PDF_TYPE:
        return "pdf"
    if mime.startswith("text/") or mime in TEXT_TYPES or mime.endswith(("+json", "+xml")):
        return "text"
    return None


def _effective_type(mime: str, filename: str) -> str:
    mime = mime.split(";")[0].strip().lower()
    if mime in GENERIC_TYPES:
        return mimetypes.guess_type(filename)[0] or mime or "application/octet-stream"
    return mime


def document_text(data: bytes, mime: str, filename: str, param: str) -> FileText:
    """The text of a document: UTF-8 text files as they are (one trailing newline
    dropped), PDFs through pypdf's text extraction (pages joined by a blank line)."""
    kind = document_kind(mime, filename, data)
    if kind is None:
        raise bad(
            f"Invalid '{param}': unsupported file type '{_effective_type(mime, filename)}' "
            f"for '{filename}'. Supported: PDF, and text files (plain text, Markdown, JSON, "
            "CSV, XML, YAML, source code).",
            param,
            "unsupported_file_type",
        )
    if kind == "pdf":
        text = _pdf_text(data, filename, param)
    else:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            text = ""
            not_text = True
        else:
            not_text = "\x00" in text
        if not_text:
            raise bad(
                f"Invalid '{param}': the file '{filename}' is not UTF-8 text.",
                param,
                "invalid_file_encoding",
            )
        text = text.removesuffix("\n").removesuffix("\r")
    return FileText(filename, text)


def _pdf_text(data: bytes, filename: str, param: str) -> str:
    import logging

    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # malformed-PDF chatter
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise bad(
                f"Invalid '{param}': the PDF '{filename}' is encrypted.", param, "invalid_file"
            )
        pages = [(page.extract_text() or "").strip() for page in reader.pages]
    except APIError:
        raise
    except (PdfReadError, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise bad(
            f"Invalid '{param}': the PDF '{filename}' could not be read ({exc}).",
            param,
            "invalid_file",
        ) from None
    text = "\n\n".join(p for p in pages if p)
    if not text:
        raise bad(
            f"Invalid '{param}': the PDF '{filename}' has no extractable text (scanned pages "
            "are not OCRed).",
            param,
            "file_has_no_text",
        )
    return text
