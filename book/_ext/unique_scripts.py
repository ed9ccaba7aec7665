"""A Sphinx extension that writes each script once per page.

Why: sphinx-thebe and sphinx-togglebutton add their inline settings while the HTML builder is
already running, and Sphinx 7.4 then lists them twice (once with no file name, once with an
empty one). The second `const THEBE_JS_URL = ...` throws "Identifier 'THEBE_JS_URL' has
already been declared" in every reader's console.
"""


def keep_first_copies(app, pagename, templatename, context, doctree) -> None:
    """Drop repeated scripts from the page, keeping the first of each and their order."""
    seen, unique = set(), []
    for script in context["script_files"]:
        key = (script.filename or "", script.priority, tuple(sorted(script.attributes.items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def setup(app):
    app.connect("html-page-context", keep_first_copies, priority=900)  # after the extensions that add scripts
    return {"parallel_read_safe": True, "parallel_write_safe": True}
