"""Exercise specs that ship with the grader: `demo`, a toy lab that shows how to write specs
and that the grader's tests use. The course's own labs register theirs in `labkit.labs.labN`.
"""
