"""The API's JSON parser, with nesting too deep for the parser a clear 400 instead of a 500."""

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


class DepthCheckedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            # Python's decoder recurses once per level; nothing this API accepts nests deeper than
            # a few levels, so a body that exhausts the recursion limit is malformed input.
            raise ParseError("JSON parse error - the document is nested too deeply (arrays or objects inside each "
                             "other more than about a thousand levels)") from None
