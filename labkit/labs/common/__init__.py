"""What the checks of two labs or more share; a helper that only one lab uses belongs in that lab's package. Each
module's first line says its job; which of them only the grader holds (hidden in the grading sandbox) is derived in
``labkit/grading/grader_only.py``."""
