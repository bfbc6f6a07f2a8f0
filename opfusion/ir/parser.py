"""(being written)"""
def parse(text):
    raise NotImplementedError
