"""Prose in Chinese, Japanese and German, written for lmforge's tests (no third-party text), and
boilerplate/spam in the same languages as a crawl has it."""

CHINESE_PROSE = """北方海岸的灯塔守护人

两百多年来，北方海岸的灯塔一直由住在塔旁的家庭看守。守塔人的一天从黎明之前开始：他们要先熄灭巨大的灯，\
擦亮透镜，修剪灯芯，这样到了黄昏灯火才能重新干净地燃烧。这份工作虽然重复，却从来不是小事，因为只要有一个夜晚\
灯光昏暗，过往的船只就可能在欧洲最危险的一段海域里失去方向。

大多数灯塔建在光秃秃的岩石上，补给只有在天气允许的时候才能用小船运来。守塔人学会了自己烤面包、自己补鞋，\
并且仔细记录风向、潮汐和每一艘经过的船。这些日志有很多保存在地方档案馆里，如今历史学家和气候科学家都在阅读\
它们。日志里写着持续好几个星期的风暴，也写着海水在岸边结冰的冬天，还有风平浪静、帆船在塔下漂了好几天的夏天。

在灯塔长大的孩子后来常常怀念那段日子。他们通常由父母在家里教书，很早就学会了看气压计，也能在夜里认出渔船的\
轮廓。客人很少来，所以补给船到达的那一天就像一个小小的节日：信件、报纸和新鲜水果被大家分享，从大陆传来的消息\
会被讨论好几天。

自动化改变了一切。从二十世纪六十年代到九十年代末，电灯、远程监控和太阳能板一座接一座地取代了常驻的守塔人。\
最后一批守塔人离开的时候心情复杂：一方面为生活变得轻松而感到宽慰，另一方面也为一个悠久的传统悄悄结束而难过。\
今天，好几座老灯塔成了博物馆，讲解员会介绍透镜是怎样工作的，游客可以沿着狭窄的楼梯爬上去，眺望同一片不安的大海。
"""

JAPANESE_PROSE = """北の海岸の灯台守

二百年以上にわたって、北の海岸の灯台は、そのそばで一年中暮らす家族によって守られてきた。灯台守の一日は夜明け前に\
始まる。大きな灯を消し、レンズを磨き、芯を切りそろえて、夕暮れにまたきれいに燃えるようにしておかなければならない。\
仕事は単調だったが、決して取るに足らないものではなかった。煙った夜が一晩あるだけで、ヨーロッパでも指折りの危険な\
海域を通る船が目印を失うことになるからである。

ほとんどの灯台はむき出しの岩の上に建てられ、物資は天候が許すときにしか船で届かなかった。灯台守たちは自分でパンを\
焼き、靴を直し、風や潮、そして通り過ぎるすべての船を丁寧に記録することを覚えた。その日誌の多くは地方の公文書館に\
残っており、今では歴史家にも気候学者にも読まれている。そこには何週間も続いた嵐のことや、岸の近くで海が凍った冬の\
こと、帆船が何日も塔の見えるところを漂っていたほど穏やかな夏のことが書かれている。

灯台で育った子どもたちは、のちにその日々を懐かしく思い出すことが多かった。彼らはたいてい家で親から勉強を教わり、\
早くから気圧計の読み方や、夜の漁船の影の見分け方を身につけた。訪れる人はまれだったので、補給船が着く日はちょっと\
したお祭りのようだった。手紙や新聞、新鮮な果物がみんなに分けられ、本土からの知らせは何日も話題になった。

自動化がすべてを変えた。千九百六十年代から九十年代の終わりまでに、電灯や遠隔監視、太陽電池が、常駐の灯台守を\
一つずつ置き換えていった。最後の灯台守たちは複雑な気持ちで去っていった。暮らしが楽になったことへの安堵と、長い\
伝統が静かに終わったことへの寂しさである。今ではいくつかの古い灯台が博物館になっており、案内係がレンズの仕組みを\
説明し、訪れた人は細い階段を上って、同じ落ち着かない海を眺めることができる。
"""

GERMAN_PROSE = """Die Leuchtturmwärter der Nordküste

Mehr als zwei Jahrhunderte lang wurden die Leuchttürme entlang der Nordküste von Familien betreut, die das ganze \
Jahr über neben ihnen lebten. Der Tag eines Wärters begann vor der Morgendämmerung, wenn die große Lampe gelöscht, \
ihre Linse poliert und ihr Docht gestutzt werden musste, damit sie in der Abenddämmerung wieder sauber brannte. Die \
Arbeit war eintönig, aber nie unwichtig: Eine einzige verrußte Nacht konnte ein vorbeifahrendes Schiff auf einem der \
gefährlichsten Gewässer Europas ohne Orientierung lassen.

Die meisten Stationen standen auf nacktem Fels, und Vorräte kamen nur mit dem Boot, wenn das Wetter es erlaubte. Die \
Wärter lernten, ihr eigenes Brot zu backen, ihre Stiefel selbst zu flicken und sorgfältig über den Wind, die Gezeiten \
und jedes vorbeifahrende Schiff Buch zu führen. Diese Logbücher, von denen viele in regionalen Archiven erhalten sind, \
werden heute von Historikern und Klimaforschern gleichermaßen gelesen. Sie beschreiben Stürme, die wochenlang \
dauerten, Winter, in denen das Meer nahe am Ufer zufror, und Sommer, die so ruhig waren, dass Segelschiffe tagelang \
in Sichtweite des Turms trieben.
"""

# navigation menus, footers and keyword spam, as extracted from crawled pages
CHINESE_MENU = "\n".join(
    ["首页", "新闻中心", "产品展示", "解决方案", "客户案例", "技术支持", "下载中心", "联系我们", "招聘信息",
     "网站地图", "隐私政策", "使用条款", "友情链接", "版权所有", "备案号", "在线客服", "常见问题", "合作伙伴",
     "公司简介", "企业文化", "发展历程", "荣誉资质", "行业动态", "公司新闻", "媒体报道", "视频中心",
     "人力资源", "投资者关系", "社会责任", "服务网点", "售后服务", "意见反馈", "手机版", "微信公众号",
     "新浪微博", "返回顶部"])
CHINESE_SPAM = "".join(f"{city}代办发票{city}代开发票电话微信同号" for city in
                       ("北京", "上海", "广州", "深圳", "杭州", "南京", "成都", "武汉", "西安", "重庆") * 4)
JAPANESE_MENU = "\n".join(
    ["ホーム", "会社概要", "事業内容", "製品情報", "サービス", "採用情報", "お知らせ", "お問い合わせ",
     "サイトマップ", "プライバシーポリシー", "利用規約", "アクセス", "よくある質問", "ニュースリリース",
     "IR情報", "サステナビリティ", "グループ会社", "拠点一覧", "カタログ請求", "資料ダウンロード",
     "セミナー情報", "導入事例", "パートナー", "English", "ページトップへ", "著作権表示"])
JAPANESE_SPAM = "\n".join(["激安ブランド財布通販送料無料最安値セール開催中今すぐチェック"] * 12)
GERMAN_MENU = "\n".join(
    ["Startseite", "Über uns", "Produkte", "Leistungen", "Referenzen", "Karriere", "Kontakt", "Impressum",
     "Datenschutz", "AGB", "Presse", "Downloads", "Newsletter", "Standorte", "Partner", "Häufige Fragen",
     "Anfahrt", "Sitemap", "Barrierefreiheit", "Cookie-Einstellungen"] * 3)
