"""Write the family table into docs/transformers.md from the registered adapters:
``python -m specalign.transformers.load.families [DOCS]`` (the project's copy by default)."""

import sys
from pathlib import Path

from specalign.doctables import replace_table
from specalign.transformers.load.families import family_table

docs = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/transformers.md")
docs.write_text(replace_table(docs.read_text(), family_table()))
print(f"{docs}: family table written ({family_table().count(chr(10)) - 2} families)")
