"""Tests of {{name}}'s node logic: `python3 -m unittest` in this folder."""

import unittest

from nodes import greet


class GreetTest(unittest.TestCase):
    def test_greets_by_name(self) -> None:
        self.assertEqual(greet("Ada"), "Hello, Ada!")


if __name__ == "__main__":
    unittest.main()
