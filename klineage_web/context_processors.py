"""Values every page's layout needs."""

import klineage
from klineage_web import env


def site(request):
    return {"klineage_version": klineage.__version__, "unsafe_no_sandbox": env.unsafe_no_sandbox()}
