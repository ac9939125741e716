"""SQL92 message selectors (placeholder docstring, completed below)."""
from .selector import SQL92, TAG, MessageSelector, SqlExpression, compile_sql92, is_tag_type
from .parser import SelectorError
