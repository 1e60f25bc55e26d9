"""Values every page's layout needs."""

import klineage


def site(request):
    return {"klineage_version": klineage.__version__}
