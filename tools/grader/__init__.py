"""The course's exercise grader (see exercises/README.md); tools/exercises.py is its command line."""
