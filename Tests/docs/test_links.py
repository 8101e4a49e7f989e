"""The documentation holds together: every relative link and #anchor in the repository's Markdown resolves, the
README stays short, and every `pubsub <subcommand> --flag` the docs show exists in that subcommand's --help.
No network: links with a scheme (https:, mailto:) are not followed."""

import os
import textwrap

import pytest

import mdcheck

README_MAX_LINES = 200


def binary():
    return os.environ.get("PUBSUB_BIN", os.path.join(mdcheck.REPO, ".build", "debug", "pubsub"))


def test_every_relative_link_and_anchor_resolves():
    files = mdcheck.markdown_files()
    # the files this test is about are all seen (a walk that skipped them would pass vacuously)
    for expected in ("README.md", "BENCHMARKS.md", "docs/OPERATIONS.md", "Deploy/README.md", "Tests/wire/README.md",
                     "Examples/background-jobs/README.md"):
        assert expected in files
    assert not any(f.startswith(".build") for f in files)
    problems = mdcheck.broken_links(files=files)
    assert problems == [], "broken links:\n" + "\n".join(problems)


def test_readme_is_short():
    lines = mdcheck.parse("README.md").lines
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; keep it at most {README_MAX_LINES} and move detail into docs/"


def test_readme_points_into_every_guide():
    # every guide in docs/ is reached from the README by following links, and the main ones straight from it
    targets = {t.split("#")[0] for _, t in mdcheck.parse("README.md").links}
    for guide in ("docs/PUBLISHING.md", "docs/PRIVATEPUB.md", "docs/BROWSER.md", "docs/RELAY.md", "docs/OPERATIONS.md",
                  "docs/CLUSTER.md", "docs/PROTOCOL.md", "docs/FAYE-DIFFERENCES.md", "docs/DESIGN.md", "docs/AUTH.md",
                  "docs/API.md", "docs/WEBHOOKS.md", "BENCHMARKS.md", "Deploy/README.md"):
        assert guide in targets, f"README.md's table of contents does not link {guide}"
    reached, todo = set(), ["README.md"]
    while todo:
        path = todo.pop()
        if path in reached:
            continue
        reached.add(path)
        for _, target in mdcheck.parse(path).links:
            target = target.split("#")[0]
            if not target or "://" in target or target.startswith("mailto:") or not target.endswith(".md"):
                continue
            linked = os.path.normpath(os.path.join(os.path.dirname(path), target))
            if os.path.exists(os.path.join(mdcheck.REPO, linked)):
                todo.append(linked)
    guides = sorted("docs/" + f for f in os.listdir(os.path.join(mdcheck.REPO, "docs")) if f.endswith(".md"))
    unreached = [g for g in guides if g not in reached]
    assert unreached == [], f"guides no link from README.md leads to: {unreached}"


def test_every_guide_says_what_it_is_for():
    # a guide starts with its title, then a paragraph that says what it is for, before any code or table
    for path in mdcheck.markdown_files():
        if not path.startswith("docs/"):
            continue
        tokens = mdcheck._md.parse(open(os.path.join(mdcheck.REPO, path), encoding="utf-8").read())
        assert tokens[0].type == "heading_open" and tokens[0].tag in ("h1", "h2"), f"{path} does not start with a title"
        after_title = next(t for t in tokens[3:] if t.type.endswith("_open") or t.type in ("fence", "code_block"))
        assert after_title.type == "paragraph_open", f"{path}: the title is not followed by a paragraph"


@pytest.mark.parametrize("path", [p for p in mdcheck.markdown_files()
                                  if p == "README.md" or p.startswith(("docs/", "Deploy/", "Examples/")) or p == "BENCHMARKS.md"])
def test_pubsub_commands_in_docs_use_flags_that_exist(path):
    bin_path = binary()
    assert os.access(bin_path, os.X_OK), f"pubsub binary not found at {bin_path} (set PUBSUB_BIN)"
    checker = mdcheck.CommandChecker(bin_path)
    problems = [f"{path}:{line}: {p}" for line, code in mdcheck.parse(path).code for p in checker.check(code)]
    assert problems == [], "\n".join(problems)


# --- the checks themselves catch what they are for


def test_github_slugs():
    assert mdcheck.github_slug("`pubsub serve` options") == "pubsub-serve-options"
    assert mdcheck.github_slug("Several nodes (Redis engine)") == "several-nodes-redis-engine"
    assert mdcheck.github_slug("CouchDB, Cloudant, Sync Gateway's REST feed") == "couchdb-cloudant-sync-gateways-rest-feed"
    assert mdcheck.github_slug("`nginx/pubsub.conf`") == "nginxpubsubconf"
    assert mdcheck.github_slug("A -- b_c") == "a----b_c"
    assert mdcheck.github_slug("Benchmarks: pubsub against Faye 1.4.0") == "benchmarks-pubsub-against-faye-140"


def test_broken_links_and_anchors_are_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(textwrap.dedent("""\
        # Title
        ## Same
        ## Same
        <a name="custom"></a>
        [ok](docs/A.md#the-a-section) [ok](#same-1) [ok](#custom) [ok](docs/) [ok](https://example.invalid/x)
        [missing file](docs/B.md) [missing anchor](docs/A.md#nope) [missing here](#same-2)
        [outside](../x.md) ![missing image](docs/pic.png) `[not a link](nowhere.md)`

        ```
        [not a link either](nowhere.md)
        ```
        """))
    (tmp_path / "docs" / "A.md").write_text("# The A section\n\ntext\n")
    problems = mdcheck.broken_links(root=str(tmp_path))
    assert [p.split(": ", 1)[1] for p in problems] == [
        "docs/B.md: docs/B.md does not exist",
        "docs/A.md#nope: no heading or anchor #nope in docs/A.md",
        "#same-2: no heading or anchor #same-2 in README.md",
        "../x.md: points outside the repository",
        "docs/pic.png: docs/pic.png does not exist",
    ]


def test_unknown_flags_and_subcommands_are_found():
    bin_path = binary()
    assert os.access(bin_path, os.X_OK), f"pubsub binary not found at {bin_path} (set PUBSUB_BIN)"
    checker = mdcheck.CommandChecker(bin_path)
    assert checker.check("pubsub serve --port 9292 --engine redis &  # --not-a-flag in a comment") == []
    assert checker.check(".build/release/pubsub relay postgres --dsn x --slot y | pubsub publish --lines /a") == []
    assert checker.check("pubsub serve --prot 9292") == ["`pubsub serve --prot`: not in `pubsub serve --help`"]
    assert checker.check("pubsub relay couchdb --dsn x") == ["`pubsub relay couchdb --dsn`: not in `pubsub relay couchdb --help`"]
    assert checker.check("pubsub serv --port 1") == ["`pubsub serv --port 1`: no such subcommand"]
