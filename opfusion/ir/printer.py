"""(being written)"""
def astext(obj, show_meta_data=True):
    return repr(obj)
