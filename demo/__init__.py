"""specdiff.demo: the end-to-end demo (``specdiff demo``) and what it is made of: the phases that
serve the tiny demo pair on a real engine and diff it against its training replay (``run``), the
seeded contract mistakes (``scenarios``) and the demo's token dataset (``data``). The CLI command
is ``tui.cmd_demo``; ``demo_models`` builds the tiny models from the layers and data defined here.
"""
