"""The API suites' import path. Their fixtures live in `apikit` and are imported by each test module: a fixture
defined here would be seen by other folders' tests when pytest runs several folders at once."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "wire"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cluster"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "browser"))
sys.path.insert(0, HERE)
