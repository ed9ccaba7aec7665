"""Exercise specs, one module per lab, named after the lab: `labN.py` registers the ids `labN.*`.

`labkit.grading.checks.get_exercise("lab2.x")` imports `lab2` here on first use.
`demo` is a toy lab that shows how to write specs and is used by the grader's tests.
"""
